"""How long a process with torch, tensordict and torchrl imported takes to end, with and without
:func:`~torchrl_muzero.trainers.quick_exit.freeze_heap_at_exit` (docs/performance_pipeline.md "Process exit").

    python benchmarks/process_exit.py            # 5 rounds, the two modes alternating
    python benchmarks/process_exit.py --rounds 9

Each round spawns one child per mode (``multiprocessing`` spawn, as the collector workers and
evaluators are started). The child imports the three packages, says it is ready and waits; the
parent then tells it to return and times from that message to the child's end (``join``): the
interpreter's finalization, what the shutdown of an async run waits for once per worker.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time


def _child(pipe, freeze: bool) -> None:
    import tensordict  # noqa: F401
    import torch  # noqa: F401
    import torchrl  # noqa: F401

    if freeze:
        from torchrl_muzero.trainers.quick_exit import freeze_heap_at_exit

        freeze_heap_at_exit()
    pipe.send("ready")
    pipe.recv()


def time_exit(freeze: bool) -> float:
    """Seconds from the 'return' message to the end of a spawned child (see the module docstring)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, freeze))
    proc.start()
    assert parent.recv() == "ready"
    time.sleep(0.3)  # the child's import work is over
    start = time.monotonic()
    parent.send("return")
    proc.join()
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    times = {False: [], True: []}
    for _ in range(args.rounds):
        for freeze in (False, True):
            times[freeze].append(time_exit(freeze))
    plain, frozen = statistics.median(times[False]), statistics.median(times[True])
    print("exit after the last line, seconds (median of {} rounds; all rounds in brackets)".format(args.rounds))
    print(f"  plain exit:          {plain:.3f}  [{', '.join(f'{t:.2f}' for t in times[False])}]")
    print(f"  freeze_heap_at_exit: {frozen:.3f}  [{', '.join(f'{t:.2f}' for t in times[True])}]")
    print(f"  ratio: {plain / frozen:.1f}x")


if __name__ == "__main__":
    main()
