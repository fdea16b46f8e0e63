"""Run the benchmark once and write its tables into docs/benchmarks.md.

    python benchmarks/write_docs.py [rotary bench options...]

The generated part sits between the `<!-- bench:start -->` and `<!-- bench:end -->` markers; the
prose around it (reading of the numbers, misses and their causes) is written by hand. It holds the RoPE
groups and the suites of `benchmarks/cases/` and `decode`; the fused-op and generation suites have
their own section, "Fused ops and generation", with its own command (pass `--suites` to choose others).
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from rotary.tools import bench
from rotary.tools.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
#: the suites of the generated block: those of benchmarks/cases/ and the decoding step
SUITES = "decode,decoder_vs_llama,hf_llama_patch"


def main(argv: list[str]) -> int:
    cases = [f"--cases={p.relative_to(ROOT)}" for p in sorted((ROOT / "benchmarks" / "cases").glob("*.py"))]
    suites = [] if any(a.startswith("--suites") for a in argv) else ["--suites", SUITES]
    args = ["bench", *cases, "--progress", *suites, *argv]
    options = build_parser().parse_args(args)
    if options.repeats is None:
        options.repeats = 3 if options.quick else 9
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine, results = bench.run(options)
    command = "python benchmarks/write_docs.py " + shlex.join(argv) if argv else "python benchmarks/write_docs.py"
    block = "\n".join(
        [
            START,
            f"Command: `{command}` (equivalent to `rotary bench {shlex.join(args[1:])}`), "
            f"run {started}, {options.repeats} interleaved repeats per method.",
            "",
            bench.format_table(machine, results, markdown=True),
            END,
        ]
    )
    text = DOC.read_text() if DOC.exists() else f"# Benchmarks\n\n{START}\n{END}\n"
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    DOC.write_text(head + block + tail)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
