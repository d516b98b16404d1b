"""Short tiny runs whose metrics are recorded once, so a change to the trainer can show it changed no number.

``python tests/train/reference_runs.py`` (re)records ``tests/train/data/reference_runs.json`` with the code as it
stands; ``tests/train/test_reference_runs.py`` runs the same configurations and compares. On the machine the
reference was recorded on (same CPU model and torch CPU capability) every logged number must be equal to the last
digit; elsewhere floating point differs across CPUs (docs/results.md: the demo ends 0.690 on an AVX2 EPYC, 0.700
on an AVX-512 one), so only a relative tolerance is asked of the first iteration's losses.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

DATA = Path(__file__).parent / "data" / "reference_runs.json"

#: Name -> ``--set`` overrides of configs/test_tiny.yaml (one RL iteration per phase).
RUNS: dict[str, tuple[str, ...]] = {
    "separate_ppo": ("critic.privileged=true", "ppo.kl_coef=0.05"),
    "none_rft": ("critic.kind=none", "critic.group_size=2", "ppo.algo=rft", "ppo.error_unlikelihood=0.1"),
    "shared_ppo": ("critic.kind=shared", "ppo.decoupled=true"),
    "action_critic_rft": ("critic.kind=action", "critic.group_size=2", "ppo.algo=critic_rft"),
}

def volatile(key: str) -> bool:
    """A logged key that is a wall-clock or memory reading, not a result."""
    return key == "time" or key.startswith("perf/")


def machine() -> dict[str, str]:
    """What decides floating point here: the CPU model and torch's CPU capability."""
    import torch

    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


def run(name: str, out: Path, demos: Path) -> list[dict]:
    """Run configuration ``name`` into ``out``; its logged records without the volatile keys."""
    from polyturn.config import load_config
    from polyturn.train.logger import read_metrics
    from polyturn.train.trainer import Trainer

    cfg_path = Path(__file__).parents[2] / "configs" / "test_tiny.yaml"
    cfg = load_config(cfg_path, [f"run.out_dir={out}", f"bc.demos={demos}", "run.checkpoint_every=100",
                                 *RUNS[name]])
    Trainer(cfg).run()
    return [{k: v for k, v in r.items() if not volatile(k)} for r in read_metrics(out / "metrics.jsonl")]


def make_demos(path: Path) -> Path:
    """The 16 noisy-expert SQL demonstrations of tests/train/conftest.py's ``demos`` fixture."""
    from polyturn.acting.episodes import generate_demos
    from polyturn.acting.jsonl import write_jsonl

    write_jsonl(path, generate_demos("polyturn/SQLAnalyst-v0", episodes=16, noise=0.3, seed=0))
    return path


def main() -> None:
    import tempfile

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        demos = make_demos(Path(tmp) / "demos.jsonl")
        runs = {name: run(name, Path(tmp) / name, demos) for name in RUNS}
    DATA.write_text(json.dumps({"machine": machine(), "runs": runs}, indent=1) + "\n")
    print(f"wrote {DATA} ({', '.join(f'{k}: {len(v)} records' for k, v in runs.items())})", file=sys.stderr)


if __name__ == "__main__":
    main()
