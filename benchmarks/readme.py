"""Copy the benchmark results into the README (between the BENCHMARKS markers).

    python benchmarks/readme.py

The README shows the quick run's header, targets and main tables from
``benchmarks/results/latest.md``, and, when ``benchmarks/results/full/latest.md``
exists, the full-size scenarios (worker RSS with 100,000 pending, 1,000,000
pending) from that run. Nothing is typed in by hand: rerun the benchmark, then
this script.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- BENCHMARKS:START -->", "<!-- BENCHMARKS:END -->"
#: Sections of the quick run shown in the README, in this order.
QUICK_SECTIONS = ("Targets", "1. Scheduling throughput", "2. Delivery lateness", "3. Worker RSS with pending delayed tasks",
                  "4. Head-of-line blocking", "Design trade-offs (radix, unit, queue type)")
FULL_SECTIONS = ("3. Worker RSS with pending delayed tasks", "6. Capacity")
INTRO = ("Reproduce with `./dev bench --quick` (about 5 minutes; CI runs it too) or `./dev bench --full`. Every "
         "system is measured in the same run, on the same broker and machine, and compared as ratios. The full "
         "output is in `benchmarks/results/latest.md`, with the raw numbers in `latest.json`.")


def split_sections(markdown: str) -> tuple[str, dict[str, str]]:
    """``(text before the first section, {section title: body})`` of a results file."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.MULTILINE)
    head, rest = parts[0], parts[1:]
    return head, {rest[i].strip(): rest[i + 1].strip() for i in range(0, len(rest), 2)}


def header_lines(head: str) -> str:
    """The run's command, mode, machine and code lines (without the file's title)."""
    return "\n".join(line for line in head.strip().splitlines() if not line.startswith("# ")).strip()


def block(quick_md: str, full_md: str | None) -> str:
    """The README block for a quick run's results and, optionally, a full run's."""
    head, sections = split_sections(quick_md)
    out = [INTRO, "", header_lines(head)]
    for title in QUICK_SECTIONS:
        if title in sections:
            out += ["", f"### {title}", "", sections[title]]
    if full_md:
        fhead, fsections = split_sections(full_md)
        out += ["", "### Full size: 100,000 and 1,000,000 pending", "", header_lines(fhead)]
        for title in FULL_SECTIONS:
            if title in fsections:
                out += ["", f"#### {title}", "", fsections[title]]
    return "\n".join(out).strip()


@click.command()
@click.option("--readme", type=click.Path(path_type=Path), default=ROOT / "README.md", show_default=True)
@click.option("--quick", "quick_path", type=click.Path(path_type=Path),
              default=ROOT / "benchmarks/results/latest.md", show_default=True)
@click.option("--full", "full_path", type=click.Path(path_type=Path),
              default=ROOT / "benchmarks/results/full/latest.md", show_default=True)
def main(readme: Path, quick_path: Path, full_path: Path) -> None:
    """Rewrite the README's benchmark block from the results files."""
    text = readme.read_text()
    if START not in text or END not in text:
        raise click.ClickException(f"{readme} has no {START} ... {END} block")
    full_md = full_path.read_text() if full_path.exists() else None
    new = block(quick_path.read_text(), full_md)
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    readme.write_text(f"{before}{START}\n{new}\n{END}{after}")
    click.echo(f"updated {readme} from {quick_path}" + (f" and {full_path}" if full_md else ""))


if __name__ == "__main__":
    main()
