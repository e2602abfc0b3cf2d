"""A small real training run for the series tests: AdamW steps between snapshots."""

from __future__ import annotations

from pathlib import Path


def make_run(root: Path, steps: tuple[int, ...] = (10, 20, 30, 40, 50), seed: int = 0) -> None:
    """``root/checkpoint-N/`` for each N: ``model.safetensors`` (bf16 and fp32 weights),
    ``optimizer.pt`` (AdamW state) and ``trainer_state.json``, N training steps in."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 128))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(64, 128), torch.randn(64, 128)
    done = 0
    root.mkdir(parents=True, exist_ok=True)
    for step in steps:
        while done < step:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            done += 1
        ck = root / f"checkpoint-{step}"
        ck.mkdir()
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        state["bf16.weight"] = state["0.weight"].to(torch.bfloat16)
        save_file(state, str(ck / "model.safetensors"))
        torch.save(opt.state_dict(), ck / "optimizer.pt")
        (ck / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
