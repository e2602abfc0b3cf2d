"""The command line, end to end through Typer's runner: the quickstart of the README."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import training
from conftest import ckptz, tree_digests
from safetensors.torch import save_file
from typer.testing import CliRunner

from ckptz.cli import app
from ckptz.components import COMPONENTS as ALL_COMPONENTS

runner = CliRunner()

COMPONENTS = set(ALL_COMPONENTS)


def test_quickstart_round_trip(small_checkpoint: Path, tmp_path: Path) -> None:
    before = tree_digests(small_checkpoint)
    packed, restored = tmp_path / "c.ckptz", tmp_path / "restored"
    result = runner.invoke(app, ["compress", str(small_checkpoint), "-o", str(packed), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "optimizer.exp_avg_sq" in result.output and "ratio" in result.output
    assert (packed / "optimizer.pt.ckptz").is_file() and (packed / "config.json").is_file()
    assert not (packed / "optimizer.pt").exists()

    result = runner.invoke(app, ["verify", str(packed), "--against", str(small_checkpoint)])
    assert result.exit_code == 0, result.output
    assert "byte-identical" in result.output

    result = runner.invoke(app, ["decompress", str(packed), "-o", str(restored)])
    assert result.exit_code == 0, result.output
    assert tree_digests(restored) == before
    assert tree_digests(small_checkpoint) == before


def test_inspect_json_shape(small_checkpoint: Path, tmp_path: Path) -> None:
    raw = runner.invoke(app, ["inspect", str(small_checkpoint), "--json"])
    assert raw.exit_code == 0, raw.output
    data = json.loads(raw.stdout)
    names = {c["name"] for c in data["components"]}
    assert (
        {"weights", "optimizer.exp_avg", "optimizer.exp_avg_sq", "rng_state", "metadata"}
        <= names
        <= COMPONENTS
    )
    assert all(c["compressed_bytes"] is None and c["ratio"] is None for c in data["components"])
    sizes = {f["path"]: f["bytes"] for f in data["files"]}
    assert sizes["optimizer.pt"] == (small_checkpoint / "optimizer.pt").stat().st_size
    assert sum(c["bytes"] for c in data["components"]) == sum(sizes.values())

    packed = tmp_path / "c.ckptz"
    assert runner.invoke(app, ["compress", str(small_checkpoint), "-o", str(packed)]).exit_code == 0
    data = json.loads(runner.invoke(app, ["inspect", str(packed), "--json"]).stdout)
    for item in data["components"] + data["files"]:
        assert {"bytes", "compressed_bytes", "ratio"} <= item.keys()
        assert (
            item["compressed_bytes"] > 0
            and abs(item["ratio"] - item["bytes"] / item["compressed_bytes"]) < 1e-9
        )
    on_disk = sum(p.stat().st_size for p in packed.rglob("*.ckptz"))
    # The containers' own index is reported on its own, not charged to a component.
    assert data["overhead_bytes"] > 0
    assert sum(c["compressed_bytes"] for c in data["components"]) + data["overhead_bytes"] == on_disk
    assert {c["name"]: c["ratio"] for c in data["components"]}["metadata"] > 1
    assert {f["path"] for f in data["files"]} == {"model.safetensors", "optimizer.pt", "rng_state.pth"}


def test_in_place_round_trip(small_checkpoint: Path, tmp_path: Path) -> None:
    import shutil

    work = tmp_path / "ck"
    shutil.copytree(small_checkpoint, work)
    before = tree_digests(work)
    assert runner.invoke(app, ["compress", str(work), "--in-place"]).exit_code == 0
    names = sorted(p.name for p in work.iterdir())
    assert "optimizer.pt" not in names and "optimizer.pt.ckptz" in names and "config.json" in names
    assert runner.invoke(app, ["decompress", str(work), "--in-place"]).exit_code == 0
    assert tree_digests(work) == before


def test_errors_are_one_line(tmp_path: Path) -> None:
    missing = runner.invoke(app, ["compress", str(tmp_path / "nope")])
    assert missing.exit_code == 1
    assert missing.stderr.strip().count("\n") == 0 and "no such file" in missing.stderr
    assert "Traceback" not in missing.output

    bogus = tmp_path / "bogus.ckptz"
    bogus.write_bytes(b"not a container at all, sorry" * 10)
    result = runner.invoke(app, ["verify", str(bogus)])
    assert result.exit_code == 1 and "bad magic" in result.output

    result = runner.invoke(app, ["decompress", str(bogus), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1 and "bad magic" in result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())

    usage = runner.invoke(app, ["compress", str(tmp_path), "--in-place", "-o", str(tmp_path / "x")])
    assert usage.exit_code == 2


def test_inspect_names_a_damaged_container_by_its_path(small_checkpoint: Path, tmp_path: Path) -> None:
    """In a folder, the error names the file as the user can find it (folder/x.ckptz)."""
    packed = tmp_path / "packed"
    assert ckptz("compress", str(small_checkpoint), "-o", str(packed), "-q").returncode == 0
    damaged = packed / "optimizer.pt.ckptz"
    damaged.write_bytes(damaged.read_bytes()[:-64])
    done = ckptz("inspect", str(packed))
    assert done.returncode == 1
    assert done.stderr.startswith(f"ckptz: error: {damaged}: "), done.stderr


def test_inspect_lists_a_damaged_container_among_the_others(small_checkpoint: Path, tmp_path: Path) -> None:
    """A damaged container in a folder is a row of the listing (named damaged, by its path),
    not the end of it: every other file is still listed, and the exit code says it failed."""
    packed = tmp_path / "packed"
    assert ckptz("compress", str(small_checkpoint), "-o", str(packed), "-q").returncode == 0
    names = sorted(p.name.removesuffix(".ckptz") for p in packed.rglob("*.ckptz"))
    assert len(names) > 1
    damaged = packed / "optimizer.pt.ckptz"
    damaged.write_bytes(damaged.read_bytes()[:-64])
    shown = ckptz("inspect", str(packed), env={"COLUMNS": "200"})
    assert shown.returncode == 1
    row = next(line for line in shown.stdout.splitlines() if "optimizer.pt" in line)
    assert "damaged" in row
    for name in names:
        assert name in shown.stdout
    assert f"ckptz: error: {damaged}: " in shown.stderr
    as_json = ckptz("inspect", str(packed), "--json")
    assert as_json.returncode == 1
    files = {f["path"]: f for f in json.loads(as_json.stdout)["files"]}
    assert sorted(p.rsplit("/", 1)[-1] for p in files) == names
    assert str(damaged) in files["optimizer.pt"]["error"]
    assert all(f["error"] is None for path, f in files.items() if path != "optimizer.pt")


def test_a_failed_compress_leaves_no_empty_output_folder_it_made(tmp_path: Path) -> None:
    """compress -o into new folders that fails (a name too long for the output) removes the
    folders it made for the run, and keeps a folder that was there before."""
    src = tmp_path / "src"
    src.mkdir()
    torch.save({"w": torch.ones(8)}, src / ("a" * 250 + ".pt"))  # 256 bytes with .ckptz
    before = sorted(p.name for p in tmp_path.iterdir())
    for source, out in ((src, "new/deeper"), (next(src.iterdir()), "single")):
        done = ckptz("compress", str(source), "-o", f"{tmp_path / out}/")
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == before
    (tmp_path / "kept").mkdir()
    assert ckptz("compress", str(src), "-o", str(tmp_path / "kept")).returncode == 1
    assert (tmp_path / "kept").is_dir()


def test_decompress_in_place_leaves_a_renamed_container_with_a_note(tmp_path: Path) -> None:
    """A container renamed without its .ckptz suffix (model.bin) in a folder decompressed in
    place has no other name to restore to: it is left as it is with one line naming it and
    saying why, and the rest of the folder is restored."""
    folder = tmp_path / "run"
    folder.mkdir()
    torch.save({"w": torch.arange(64.0)}, folder / "a.pt")
    torch.save({"w": torch.ones(32)}, folder / "b.pt")
    want = (folder / "a.pt").read_bytes()
    assert ckptz("compress", str(folder), "--in-place", "-q").returncode == 0
    renamed = folder / "model.bin"
    (folder / "b.pt.ckptz").rename(renamed)
    kept = renamed.read_bytes()
    done = ckptz("decompress", str(folder), "--in-place")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert (folder / "a.pt").read_bytes() == want and not (folder / "a.pt.ckptz").exists()
    assert renamed.read_bytes() == kept
    notes = [ln for ln in done.stderr.splitlines() if "model.bin" in ln]
    assert len(notes) == 1 and "does not end in .ckptz" in notes[0], done.stderr


def test_json_on_failure_is_one_json_object_on_stdout(small_checkpoint: Path, tmp_path: Path) -> None:
    """A script that runs `ckptz CMD --json` and parses stdout gets JSON whether the command
    succeeds or fails: on failure one object with ok false and the error, the same one line
    on stderr as without --json, and the exit code the error has."""
    truncated = tmp_path / "model.pt.ckptz"
    assert (
        ckptz("compress", str(small_checkpoint / "optimizer.pt"), "-o", str(truncated), "-q").returncode == 0
    )
    truncated.write_bytes(truncated.read_bytes()[:-100])
    cases = [
        (["compress", str(tmp_path / "nope"), "--json"], 1, "InputNotFoundError"),
        (
            ["decompress", str(small_checkpoint / "optimizer.pt"), "-o", str(tmp_path / "x"), "--json"],
            1,
            "ContainerError",
        ),
        (["inspect", str(truncated), "--json"], 1, "ContainerError"),
        (["verify", str(tmp_path / "nope"), "--json"], 1, "InputNotFoundError"),
        (["compress", str(small_checkpoint), "--level", "99", "--json"], 2, "UsageError"),
        (["verify", str(truncated), "--bogus", "--json"], 2, "UsageError"),
    ]
    for args, code, kind in cases:
        done = ckptz(*args)
        assert done.returncode == code, (args, done.stderr)
        assert done.stderr.startswith("ckptz: error: ") and done.stderr.count("\n") == 1, done.stderr
        out = json.loads(done.stdout)
        assert out["ok"] is False and out["error"]["type"] == kind, out
        assert out["error"]["exit_code"] == code and out["error"]["message"] in done.stderr, out
    without = ckptz("compress", str(tmp_path / "nope"))
    assert without.stdout == "" and without.returncode == 1


def test_refuses_to_overwrite(small_checkpoint: Path, tmp_path: Path) -> None:
    packed = tmp_path / "c.ckptz"
    assert runner.invoke(app, ["compress", str(small_checkpoint), "-o", str(packed)]).exit_code == 0
    (packed / "config.json").write_text("{}")  # not what this run writes
    again = runner.invoke(app, ["compress", str(small_checkpoint), "-o", str(packed)])
    assert again.exit_code == 2 and "already exists" in again.stderr
    assert (
        runner.invoke(app, ["compress", str(small_checkpoint), "-o", str(packed), "--force"]).exit_code == 0
    )


def test_a_file_where_the_output_folder_goes_is_named(small_checkpoint: Path, tmp_path: Path) -> None:
    """`-o FILE/` (or several sources into FILE) names the file in the way, whatever the
    sources are, rather than "cannot write (File exists)" about a path that does not exist."""
    blocker = tmp_path / "out"
    blocker.write_text("notes")
    model, optimizer = str(small_checkpoint / "model.safetensors"), str(small_checkpoint / "optimizer.pt")
    for args in (
        ["compress", str(small_checkpoint), "-o", f"{blocker}/"],
        ["compress", model, "-o", f"{blocker}/"],
        ["compress", model, optimizer, "-o", str(blocker)],
        ["compress", model, "-o", str(blocker / "deeper" / "model.ckptz")],
    ):
        done = ckptz(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr == f"ckptz: error: {blocker}: a file is in the way of an output folder\n", args
    assert blocker.read_text() == "notes"


def _null_device(path: Path) -> Path:
    """A character device like /dev/null at ``path`` (a test must never risk the real one)."""
    import stat

    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return path


def test_output_to_a_device_is_written_into_never_replaced(small_checkpoint: Path, tmp_path: Path) -> None:
    """`-o /dev/null` (to time a run without keeping it) writes into the device, as zstd
    does; with -f it replaced the device by a regular file, which as root breaks /dev/null
    for the whole machine. A fifo is refused in one line."""
    import stat

    null = _null_device(tmp_path / "null")
    model = str(small_checkpoint / "optimizer.pt")
    packed = tmp_path / "optimizer.pt.ckptz"
    assert ckptz("compress", model, "-o", str(packed), "-q").returncode == 0
    for args in (
        ["compress", model, "-o", str(null)],
        ["compress", model, "-o", str(null), "-f", "--verify"],
        ["decompress", str(packed), "-o", str(null), "-f"],
        ["decompress", str(packed), "-o", str(null)],
    ):
        done = ckptz(*args, "-q")
        assert done.returncode == 0, (args, done.stderr)
        assert stat.S_ISCHR(null.lstat().st_mode), args
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = ckptz("compress", model, "-o", str(fifo), "-f")
    assert (
        done.returncode == 2
        and done.stderr
        == f"ckptz: error: {fifo}: output is not a regular file (write to a file, or to stdout with -c)\n"
    )
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_long_file_names_that_fit_with_ckptz_are_compressed(small_checkpoint: Path, tmp_path: Path) -> None:
    """A name of 230-249 bytes fits with .ckptz (255 at most) but not with the temporary
    name's additions: the run failed on it. The library's writers too."""
    src = tmp_path / "run"
    src.mkdir()
    data = (small_checkpoint / "optimizer.pt").read_bytes()
    for n in (200, 230, 249):
        (src / ("w" * n)).write_bytes(data)
    (src / ("é" * 120)).write_bytes(data)  # 240 bytes of UTF-8, cut inside no character
    want = tree_digests(src)
    done = ckptz("compress", str(src), "--in-place", "-q")
    assert done.returncode == 0, done.stderr
    assert all(p.name.endswith(".ckptz") for p in src.iterdir())
    assert ckptz("decompress", str(src), "--in-place", "-q").returncode == 0
    assert tree_digests(src) == want
    too_long = tmp_path / "too_long"
    too_long.mkdir()
    (too_long / ("t" * 252)).write_bytes(data)  # no room for .ckptz: say so, not "check permissions"
    for args in (["-o", f"{tmp_path / 'out'}/"], ["--in-place"]):
        done = ckptz("compress", str(too_long), *args, "-q")
        assert done.returncode == 1 and "too long" in done.stderr and "permissions" not in done.stderr, (
            done.stderr
        )
        assert (too_long / ("t" * 252)).read_bytes() == data
    import ckptz as library

    long = tmp_path / ("v" * 240 + ".ckptz")
    library.save_file({"w": torch.ones(2)}, long, device="cpu")
    assert torch.equal(library.load_file(long)["w"], torch.ones(2))
    library.save({"w": torch.ones(2)}, long, device="cpu", _use_new_zipfile_serialization=False)
    assert torch.equal(library.load(long)["w"], torch.ones(2))


def test_verify_names_the_damaged_file(small_checkpoint: Path, tmp_path: Path) -> None:
    packed = tmp_path / "c.ckptz"
    assert runner.invoke(app, ["compress", str(small_checkpoint), "-o", str(packed)]).exit_code == 0
    target = packed / "optimizer.pt.ckptz"
    data = bytearray(target.read_bytes())
    data[200] ^= 0x01
    target.write_bytes(bytes(data))
    result = runner.invoke(app, ["verify", str(packed), "--json"])
    assert result.exit_code == 1
    verdicts = {f["path"]: f for f in json.loads(result.stdout)["files"]}
    assert verdicts["model.safetensors.ckptz"]["ok"]
    bad = verdicts["optimizer.pt.ckptz"]
    assert not bad["ok"] and bad["status"] == "damaged", bad
    assert "offset" in bad["error"] and "chunk" not in bad["error"], bad  # in the original's terms


def test_help_and_module_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ckptz", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("compress", "decompress", "inspect", "verify"):
        assert command in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "ckptz", "compress", "--help"], capture_output=True, text=True, check=True
    )
    assert "--codec" in out.stdout and "ans" in out.stdout and "--device" in out.stdout


def test_brackets_in_paths_and_notices_print_as_they_are(small_checkpoint: Path, tmp_path: Path) -> None:
    """Rich markup is off: '[gpu]' in a file name or in a notice is not taken for a tag."""
    src = tmp_path / "run[gpu]"
    shutil.copytree(small_checkpoint, src)
    (src / "model.safetensors").rename(src / "model[gpu].safetensors")
    packed = tmp_path / "packed"
    result = runner.invoke(app, ["compress", str(src), "-o", str(packed), "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "run[gpu]" in result.stdout
    if "nvCOMP is not installed" in result.stderr:
        assert "pip install 'ckptz[gpu]'" in result.stderr
    inspected = runner.invoke(app, ["inspect", str(packed)])
    assert inspected.exit_code == 0 and "model[gpu].safetensors" in inspected.stdout


def test_verify_footer_counts_in_good_english(small_checkpoint: Path, tmp_path: Path) -> None:
    one = tmp_path / "one.ckptz"
    done = runner.invoke(
        app, ["compress", str(small_checkpoint / "optimizer.pt"), "-o", str(one), "--device", "cpu"]
    )
    assert done.exit_code == 0, done.output
    done = runner.invoke(app, ["verify", str(one), "--no-progress"])
    assert done.exit_code == 0 and "1 container decodes and matches its checksums" in done.output, done.output
    done = runner.invoke(
        app, ["verify", str(one), "--against", str(small_checkpoint / "optimizer.pt"), "--no-progress"]
    )
    assert done.exit_code == 0 and "the file matches" in done.output, done.output
    packed = tmp_path / "all.ckptz"
    assert (
        runner.invoke(
            app, ["compress", str(small_checkpoint), "-o", str(packed), "--device", "cpu"]
        ).exit_code
        == 0
    )
    done = runner.invoke(app, ["verify", str(packed), "--no-progress"])
    assert done.exit_code == 0 and "containers decode and match their checksums" in done.output, done.output
    done = ckptz(
        "compress", str(small_checkpoint / "optimizer.pt"), "-o", str(tmp_path / "t1.ckptz"), "-T", "1"
    )
    assert done.returncode == 0 and "(1 thread) in" in done.stdout, done.stdout


def test_decompress_takes_a_memory_budget(small_checkpoint: Path, tmp_path: Path) -> None:
    """``--memory`` bounds a restore's GPU buffers as it does a compression's; a size that
    is not one is one clear line."""
    packed, restored = tmp_path / "c.ckptz", tmp_path / "restored"
    assert (
        runner.invoke(
            app, ["compress", str(small_checkpoint), "-o", str(packed), "--device", "cpu"]
        ).exit_code
        == 0
    )
    result = runner.invoke(app, ["decompress", str(packed), "-o", str(restored), "--memory", "1GiB"])
    assert result.exit_code == 0, result.output
    assert tree_digests(restored) == tree_digests(small_checkpoint)
    bad = runner.invoke(app, ["decompress", str(packed), "-o", str(tmp_path / "r2"), "--memory", "lots"])
    assert (
        bad.exit_code == 2
        and bad.output == "ckptz: error: cannot read size 'lots' (write e.g. 4GiB or 512MB)\n"
    )
    assert not (tmp_path / "r2").exists()
    for endless in ("inf", "1e400"):  # floats past any integer: one line, not an OverflowError
        bad = ckptz("compress", str(small_checkpoint), "-o", str(tmp_path / "c2"), "--memory", endless)
        assert (
            bad.returncode == 2
            and bad.stderr == f"ckptz: error: cannot read size '{endless}' (write e.g. 4GiB or 512MB)\n"
        )


def second_moments_of_a_short_training_run() -> dict[str, torch.Tensor]:
    """AdamW's ``exp_avg_sq`` of a small GPT-2 after 30 real steps, by parameter name."""
    return training.moments(*training.short_run(training.repeated_quarter), "exp_avg_sq")


def test_level_19_codes_second_moments_as_small_under_plain_names(tmp_path: Path) -> None:
    """The coder is chosen by the data, not by key names: Adam's second moments saved under
    their parameters' names code as small as under Adam's keys."""
    moments = second_moments_of_a_short_training_run()
    adam, plain = tmp_path / "adam.safetensors", tmp_path / "plain.safetensors"
    save_file({f"optimizer.state.{n}.exp_avg_sq": t for n, t in moments.items()}, str(adam))
    save_file(moments, str(plain))
    ratios = {}
    for src in (adam, plain):
        out = tmp_path / f"{src.stem}.ckptz"
        done = ckptz("compress", str(src), "-o", str(out), "--device", "cpu", "--level", "19")
        assert done.returncode == 0, done.stderr
        ratios[src.stem] = src.stat().st_size / out.stat().st_size
    # Only the keys (a few hundred bytes of 2.7 MB) differ; order-1 exponents save ~0.6%.
    assert ratios["plain"] >= ratios["adam"] * 0.999, ratios
