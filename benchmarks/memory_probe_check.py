"""The memory probe on a real device: the largest micro-batch of the packaged MiniLM that trains there.

    python benchmarks/memory_probe_check.py [--device cuda:0] [--max-length 256] [--high 4096]

Why it exists: ``DdpConfig(max_micro_batch="auto")`` is tested on the CPU with a stand-in limit; on a GPU the
limit is the allocator's. This runs ``flodl_hf.elche.memory_probe.probe_micro_batch`` on the packaged MiniLM with texts
of ``--max-length`` tokens and prints the cap it finds (up to ``--high``), the number of tries and the time. On a CPU
nothing raises out of memory, so the cap is ``--high`` (run it there with a small ``--high``).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--high", type=int, default=4096, help="the largest micro-batch tried (samples)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    args = p.parse_args(argv)

    from flodl_hf.elche import memory_probe
    from flodl_hf.defaults import default_model_path
    from heads import AutoHeadForSequenceClassification

    device = torch.device(args.device)
    head = AutoHeadForSequenceClassification.from_pretrained(str(default_model_path()), num_labels=3,
                                                             max_length=args.max_length)
    module = head.graph().module.to(device)
    text = " ".join(["word"] * (2 * args.max_length))  # truncated to max_length tokens: the longest kind
    data = [{"text": text, "label": 0}]
    tries: list[int] = []
    autocast = ((lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if args.precision == "bf16" else None)
    start = time.perf_counter()
    cap = memory_probe.probe_micro_batch(module, device, data, head.collate, 1, args.high, autocast,
                                         on_try=lambda n, ok: tries.append(n),
                                         reserve_bytes=memory_probe.optimizer_reserve_bytes(module))
    took = time.perf_counter() - start
    total = torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else None
    print(f"memory probe: {device}{f' ({total:.0f} GiB)' if total else ''}, MiniLM, {args.max_length} tokens, "
          f"{args.precision}: largest micro-batch {cap} of at most {args.high} ({len(tries)} tries: {tries}) in "
          f"{took:.1f} s")
    return 0 if cap > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
