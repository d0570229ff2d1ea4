"""Run metrics: torchrl loggers, a tqdm progress bar and the learning-curve PNG."""
from __future__ import annotations

import csv
import time
from pathlib import Path

__all__ = ["RunMetrics", "plot_learning_curve"]


def _make_logger(backend: str, run_dir: Path, project: str):
    if backend == "none":
        return None
    if backend == "csv":
        from torchrl.record.loggers.csv import CSVLogger

        return CSVLogger(exp_name="logs", log_dir=str(run_dir))
    if backend == "tensorboard":
        from torchrl.record.loggers.tensorboard import TensorboardLogger

        return TensorboardLogger(exp_name="logs", log_dir=str(run_dir))
    if backend == "wandb":
        from torchrl.record.loggers.wandb import WandbLogger

        return WandbLogger(exp_name=run_dir.name, save_dir=str(run_dir), project=project)
    raise ValueError(f"logger.backend must be csv, tensorboard, wandb or none, got {backend!r}.")


class RunMetrics:
    """Counters, scalar logging and the evaluation history of one run.

    Scalars go to a torchrl logger (CSV by default, TensorBoard or W&B by
    config); evaluations also go to ``eval.csv`` in the run folder, which
    :func:`plot_learning_curve` turns into ``learning_curve.png``.

    Examples:
        >>> import tempfile
        >>> from torchrl_muzero.trainers.metrics import RunMetrics
        >>> metrics = RunMetrics(tempfile.mkdtemp(), backend="csv", progress_bar=False)
        >>> metrics.log_eval(env_steps=1000, train_iter=250, policy_version=250, mean_return=42.0)
        >>> metrics.close()
        >>> (metrics.run_dir / "learning_curve.png").exists()
        True
    """

    def __init__(self, run_dir: str | Path, backend: str = "csv", project: str = "torchrl_muzero",
                 progress_bar: bool = True, total_env_steps: int = 0) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logger = _make_logger(backend, self.run_dir, project)
        self.start = time.monotonic()
        self.wall_offset = 0.0  # wall time of earlier segments of a resumed run
        self.eval_path = self.run_dir / "eval.csv"
        if not self.eval_path.exists():
            with open(self.eval_path, "w", newline="") as f:
                csv.writer(f).writerow(["env_steps", "wall_s", "train_iter", "policy_version", "mean_return"])
        self.bar = None
        if progress_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total_env_steps or None, unit="env step", dynamic_ncols=True)
        self._bar_steps = 0
        self.last_eval_return = float("nan")

    def wall(self) -> float:
        return self.wall_offset + time.monotonic() - self.start

    def log(self, step: int, values: dict[str, float]) -> None:
        if self.logger is None:
            return
        for name, value in values.items():
            self.logger.log_scalar(name, float(value), step=step)

    def log_eval(self, env_steps: int, train_iter: int, policy_version: int, mean_return: float) -> None:
        self.last_eval_return = mean_return
        with open(self.eval_path, "a", newline="") as f:
            csv.writer(f).writerow([env_steps, f"{self.wall():.2f}", train_iter, policy_version, f"{mean_return:.3f}"])
        self.log(env_steps, {"eval/mean_return": mean_return, "eval/policy_version": policy_version})

    def progress(self, env_steps: int, train_iter: int, lag: float | None = None) -> None:
        if self.bar is None:
            return
        self.bar.update(max(0, env_steps - self._bar_steps))
        self._bar_steps = env_steps
        post = {"train_iter": train_iter, "eval_return": f"{self.last_eval_return:.1f}"}
        if lag is not None:
            post["lag"] = f"{lag:.1f}"
        self.bar.set_postfix(post, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        try:
            plot_learning_curve(self.eval_path, self.run_dir / "learning_curve.png")
        except Exception as err:  # a missing plot must never fail a finished run
            print(f"torchrl_muzero: could not draw the learning curve: {err}")


def plot_learning_curve(eval_csv: str | Path, png_path: str | Path) -> Path | None:
    """Draw mean evaluation return against env steps and wall time."""
    rows = list(csv.DictReader(open(eval_csv)))
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [int(r["env_steps"]) for r in rows]
    wall = [float(r["wall_s"]) for r in rows]
    ret = [float(r["mean_return"]) for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].plot(steps, ret, marker="o")
    axes[0].set_xlabel("env steps")
    axes[1].plot(wall, ret, marker="o")
    axes[1].set_xlabel("wall time (s)")
    for ax in axes:
        ax.set_ylabel("mean evaluation return")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=90)
    plt.close(fig)
    return Path(png_path)
