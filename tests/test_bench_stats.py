"""The benchmarks' pure statistics: how clumped arrivals are (benchmarks/common.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for benchmarks
from benchmarks.common import arrival_bursts  # noqa: E402


def test_evenly_spaced_arrivals_are_bursts_of_one() -> None:
    assert arrival_bursts([i * 0.002 for i in range(500)]) == {"burst_p99": 1, "burst_max": 1}


def test_a_clump_of_32_is_what_most_messages_arrive_in() -> None:
    smooth = [i * 0.01 for i in range(100)]
    clump = [5.0 + i * 0.0001 for i in range(32)]
    got = arrival_bursts(smooth + clump)
    assert got["burst_max"] == 32
    assert got["burst_p99"] == 32  # 32 of 132 messages came in the clump: above the 1% tail


def test_no_arrivals() -> None:
    assert arrival_bursts([]) == {"burst_p99": None, "burst_max": None}


def test_drain_profile_names_the_busiest_processes_by_work_between_two_readings() -> None:
    from benchmarks.faults.drain_profile import busiest, parse

    before = parse("[{[60,48,46,49,46,48,62],100,'%2F_q.exit'},{[60,48,46,50,46,48,62],50,{rabbit_channel,init,1}},"
                   "{[60,48,46,51,46,48,62],7,ra_log_wal}]")
    after = parse("[{[60,48,46,49,46,48,62],400,'%2F_q.exit'},{[60,48,46,50,46,48,62],150,{rabbit_channel,init,1}},"
                  "{[60,48,46,52,46,48,62],999,newcomer}]")
    assert before["<0.1.0>"] == (100, "%2F_q.exit")
    rows = busiest(before, after)
    assert [(name, d) for name, d, _ in rows] == [("%2F_q.exit", 300), ("{rabbit_channel,init,1}", 100)]
    assert abs(rows[0][2] - 0.75) < 1e-9  # a process that appeared in between is not counted


def test_publish_share_sums_profiled_time_by_package_and_gives_each_alternations_share() -> None:
    from benchmarks.publish_share import MODES, markdown, package_of

    assert package_of("/x/site-packages/celery_delayq/rabbitmq/publisher.py") == "celery_delayq"
    assert package_of("/x/site-packages/celery/app/task.py") == "celery"
    assert package_of("~") == "builtins (socket, encoding)"
    rates = {"celery_confirmed": 1000.0, "celery_countdown_confirmed": 850.0, "delayq": 900.0, "delayq_repeat": 950.0,
             "celery_unconfirmed": 5000.0, "celery_countdown_unconfirmed": 4000.0, "delayq_batch": 3000.0,
             "delayq_batch_repeat": 3500.0}
    hops = {"delayq": 7, "delayq_repeat": 1, "delayq_batch": 7, "delayq_batch_repeat": 1}
    runs = [{"mode": m, "rate": rates[m] * k, "wall_us": 1e6 / (rates[m] * k), "cpu_us": 1.0, "hops": hops.get(m)}
            for k in (1.0, 0.5) for m in MODES]
    doc = {"when": "2026-11-26", "broker": "4.3.6", "calls": 10, "rounds": 1, "alternations": 2, "argv": "x",
           "countdowns": {"delayq": 900.0, "delayq_repeat": 300.0, "celery_countdown_unconfirmed": 900.0,
                          "celery_countdown_confirmed": 900.0},
           "runs": runs, "packages": {m: {"celery": 2.0, "celery_delayq": 1.0 if "delayq" in m else 0.0} for m in MODES}}
    text = markdown(doc)
    assert "confirm each, ladder / Celery with `confirm_publish`: 0.90, 0.90" in text
    assert "a repeated countdown (its one-hop queue) / Celery with `confirm_publish`: 0.95, 0.95" in text
    assert "`batch()`, ladder / Celery unconfirmed, no delay: 0.60, 0.60" in text
    assert "confirm each, ladder / Celery with `confirm_publish`, same countdown: 1.06, 1.06" in text
    assert "| celery_delayq | 0.0 | 0.0 | 1.0 | 1.0 | 0.0 | 0.0 | 1.0 | 1.0 |" in text
    assert "| delayq | 900 | 7 | 900, 450 |" in text and "| delayq_repeat | 300 | 1 | 950, 475 |" in text
    assert "| celery_unconfirmed | - | - | 5,000, 2,500 |" in text  # no countdown, no path of ours
    assert "Instructions per call" not in text  # neither counted here: no broker CPU column either
    assert sum(1 for line in text.splitlines() if line.endswith("| - |")) == len(MODES)
    runs[0]["broker_cpu_us"], runs[len(MODES)]["broker_cpu_us"] = 50.0, 70.0  # celery_confirmed, both alternations
    doc["instructions"] = {"celery_confirmed": 1500.0, "celery_countdown_confirmed": 1600.0, "delayq": 2000.0,
                           "delayq_repeat": 1875.0, "celery_unconfirmed": 1400.0,
                           "celery_countdown_unconfirmed": 1600.0,
                           "delayq_batch": 1700.0, "delayq_batch_repeat": 1750.0}
    text = markdown(doc)
    assert "| celery_confirmed | - | - | 1,000, 500 | 1000.0 | 1.0 | 60 |" in text  # the median broker CPU
    assert "| every thread | 1,500k | 1,600k | 2,000k | 1,875k | 1,400k | 1,600k | 1,700k | 1,750k |" in text
    assert "confirm each, ladder / Celery with `confirm_publish`: 0.75 (every thread)\n" in text
    assert "(its one-hop queue) / Celery with `confirm_publish`: 0.80 (every thread)" in text
    assert "`batch()`, ladder / Celery unconfirmed, no delay: 0.82 (every thread)" in text
    assert "`batch()`, ladder / Celery unconfirmed, same countdown: 0.94 (every thread)" in text
    assert "calling thread" not in text  # results of before the per-thread count: one number each
    # Counted per thread: both rows, and each share from both.
    doc["instructions"] = {m: {"all": v, "calling": v * 0.9 if m == "delayq" else v}
                           for m, v in doc["instructions"].items()}
    text = markdown(doc)
    assert "| the calling thread | 1,500k | 1,600k | 1,800k | 1,875k |" in text
    assert ("ladder / Celery with `confirm_publish`, same countdown: 0.80 (every thread); 0.89 (the calling thread)"
            in text)
    assert ("confirm each, ladder / Celery with `confirm_publish`: 0.75 (every thread); 0.83 (the calling thread)"
            in text)


def test_publish_share_reads_callgrinds_per_thread_summaries(tmp_path: Path) -> None:
    from benchmarks.publish_share import thread_counts

    for name, total in (("calls600-01", 900), ("calls600-02", 120), ("calls600-03", 30)):
        (tmp_path / name).write_text(f"# callgrind format\nversion: 1\nevents: Ir\nsummary: {total}\n")
    assert thread_counts(sorted(tmp_path.glob("calls600-*"))) == [900, 120, 30]
    (tmp_path / "broken-01").write_text("events: Ir\n")
    with pytest.raises(Exception, match="no summary"):
        thread_counts([tmp_path / "broken-01"])


def test_steady_publish_gives_each_settings_processes_median_and_queues() -> None:
    from benchmarks.steady_publish import markdown

    runs = [{"setting": "default", "process": k, "calls": 1000, "rate": r, "queues": q, "broker_cpu_us": c}
            for k, (r, q, c) in enumerate([(900.0, 67, 600.0), (1100.0, 71, 500.0), (1000.0, 71, 550.0)])]
    runs += [{"setting": "ladder", "process": 0, "calls": 1000, "rate": 1200.0, "queues": 63}]
    doc = {"broker": "3.10.8", "when": "2026-11-29", "argv": "x", "processes": 3, "seconds": 8.0, "countdown": 300.0,
           "settings": ["default", "ladder"], "runs": runs}
    text = markdown(doc)
    assert "| default | 900, 1,100, 1,000 | 1,000 | 550 | 67, 71, 71 |" in text
    assert "| ladder | 1,200 | 1,200 | - | 63 |" in text  # no broker CPU measured: a dash
    assert "apply_async(countdown=300)" in text


def test_entry_by_queue_gives_each_measures_medians_and_the_by_queue_share() -> None:
    from benchmarks.entry_by_queue import MEASURES, markdown

    runs = {field: {"topic": [100.0, 300.0, 200.0], "queue_bcc": [90.0, 110.0, None]} for _label, field in MEASURES}
    runs["hop4"] = {"topic": [None], "queue_bcc": [None]}  # the broker was not on this machine
    text = markdown({"broker": "3.10.8", "when": "2026-11-29", "argv": "x", "rounds": 3, "runs": runs})
    assert "| publish, confirm each: wall µs | 200 | 100 | 0.50 |" in text
    assert "| 4 hops: broker CPU µs per message | - | - | - |" in text


def test_publish_layers_gives_each_layer_per_mode_and_a_dash_off_its_path() -> None:
    from benchmarks.publish_layers import markdown

    runs = [{"mode": "celery", "layers": {"apply_async": 600.0, "producer.publish": 500.0, "send+confirm": 450.0}},
            {"mode": "ladder", "layers": {"apply_async": 700.0, "producer.publish": 560.0, "send": 70.0,
                                          "confirm wait": 440.0}}]
    text = markdown({"broker": "4.3.6", "when": "2026-11-29", "argv": "x", "runs": runs})
    assert "| apply_async | the whole call | 600.0 | 700.0 |" in text
    assert "| send | the frames sent | - | 70.0 |" in text
    assert "| send+confirm | Celery: the frames sent and the confirm awaited | 450.0 | - |" in text
    assert "| divert |" not in text  # on no mode's path here: no row


def test_publish_share_renders_the_committed_results_of_this_and_the_earlier_version() -> None:
    import json

    from benchmarks.common import RESULTS_DIR
    from benchmarks.publish_share import markdown

    for stem in ("publish_share_threads", "publish_share_threads_rmq4"):  # this version: the file, byte for byte
        doc = json.loads((RESULTS_DIR / f"{stem}.json").read_text())
        assert markdown(doc) == (RESULTS_DIR / f"{stem}.md").read_text()
    earlier = json.loads((RESULTS_DIR / "publish_share.json").read_text())  # before celery_countdown_confirmed
    text = markdown(earlier)
    assert "celery_countdown_confirmed" not in text and "same countdown: " in text  # the batch share it had
    assert "| every thread | 1,593k | 1,856k |" in text and "calling thread" not in text


def test_confirm_path_gives_each_paths_median_and_its_share_of_celerys_and_of_the_step_before() -> None:
    from benchmarks.confirm_path import PATHS, markdown

    walls = {"celery": [600.0, 700.0, 650.0], "headers": [650.0], "mandatory": [650.0], "level_queue": [650.0],
             "ladder": [700.0, 725.0, 740.0], "fanout": [640.0, 660.0, 700.0]}
    runs = {p: {"wall": walls[p], "broker_cpu": None if p == "mandatory" else 400.0} for p in PATHS}
    text = markdown({"broker": "3.10.8", "when": "2026-11-29", "argv": "x", "rounds": 3, "batch": 200, "runs": runs})
    assert "| celery | Celery's headers, direct exchange, quorum queue | 650 | 400 | 1.00 | - |" in text
    assert "| mandatory | `mandatory` | 650 | - | 1.00 | 1.00 |" in text  # the broker was not on this machine
    assert "| ladder | the level's topic exchange, 15-word key | 725 | 400 | 0.90 | 0.90 |" in text
    assert "| fanout | instead, the queue's own fanout exchange (key kept) | 660 | 400 | 0.98 | 1.10 |" in text
    del runs["fanout"]  # a run before the entry exchanges: its paths only
    earlier = markdown({"broker": "3.10.8", "when": "2026-11-29", "argv": "x", "rounds": 3, "batch": 200, "runs": runs})
    assert "fanout" not in earlier and "| ladder |" in earlier


def test_share_interleaved_divides_summed_times_of_the_same_rounds() -> None:
    from benchmarks.share_interleaved import MODES, markdown, sum_share

    assert sum_share([100.0, 300.0], [80.0, 120.0]) == pytest.approx(0.5)
    runs = {m: {"wall": [100.0, 100.0], "cpu": [50.0, 50.0]} for m in MODES}
    runs["delayq"] = {"wall": [120.0, 130.0], "cpu": [50.0, 75.0]}
    text = markdown({"broker": "4.3.6", "when": "2026-11-29", "argv": "x", "rounds": 2, "batch": 200,
                     "countdown": 900.0, "repeat_countdown": 300.0, "runs": runs})
    assert "| delayq | 125.0 | 62.5 |" in text
    assert "- ladder, confirm each / Celery's `confirm_publish`: **0.80** (calling thread's CPU: 0.80)" in text
    assert "one hop) / Celery's `confirm_publish`: **1.00**" in text
    assert "without it (`delayq_index = False`): **0.80**" in text
    assert "(1.0.0rc1) / Celery's `confirm_publish`: **1.00**" in text
    assert "entry exchange / through the level's topic exchange (1.0.0rc1): **0.80**" in text
    del runs["delayq_noindex"]  # a run of the version before it: its rows and shares only
    earlier = markdown({"broker": "4.3.6", "when": "2026-11-29", "argv": "x", "rounds": 2, "batch": 200,
                        "countdown": 900.0, "repeat_countdown": 300.0, "runs": runs})
    assert "delayq_noindex" not in earlier and "delayq_index" not in earlier and "| delayq | 125.0 |" in earlier


def test_cache_sim_reads_cachegrinds_summary_and_gives_celerys_share_of_each_event() -> None:
    from benchmarks.cache_sim import EVENTS, MODES, markdown, per_call, read_summary

    text = "desc: I1 cache: 32768 B\ncmd: python\nevents: Ir I1mr D1mr\nsummary: 1000 40 20\n"
    assert read_summary(text) == {"Ir": 1000, "I1mr": 40, "D1mr": 20}
    assert per_call({"Ir": 1000, "I1mr": 40}, {"Ir": 4000, "I1mr": 100, "Bc": 9}, 300) == {"Ir": 10.0, "I1mr": 0.2}
    runs = {m: {event: 1000.0 for event, _what in EVENTS} for m in MODES}
    runs["delayq"]["I1mr"] = 1250.0
    text = markdown({"broker": "3.10.8", "when": "2026-11-29", "argv": "x", "calls": [100, 400], "runs": runs})
    assert "| instruction cache misses (L1) (`I1mr`) | 1.0k | 1.2k (0.80) | 1.0k (1.00) |" in text
    assert "400 calls less 100" in text


@pytest.mark.parametrize("name", ["confirm_path", "share_interleaved", "cache_sim"])
@pytest.mark.parametrize("line", ["", "_rmq4"])
def test_the_committed_results_of_the_one_process_benchmarks_render_as_committed(name: str, line: str) -> None:
    import importlib
    import json

    from benchmarks.common import RESULTS_DIR

    doc = json.loads((RESULTS_DIR / f"{name}{line}.json").read_text())
    assert importlib.import_module(f"benchmarks.{name}").markdown(doc) == (RESULTS_DIR / f"{name}{line}.md").read_text()


@pytest.mark.parametrize("name", ["confirm_path", "share_interleaved"])
@pytest.mark.parametrize("option", ["--rounds", "--batch"])
def test_the_one_process_benchmarks_refuse_an_empty_run_before_touching_the_broker(name: str, option: str) -> None:
    import importlib

    from click.testing import CliRunner

    done = CliRunner().invoke(importlib.import_module(f"benchmarks.{name}").main, [option, "0"])
    assert done.exit_code == 2 and f"Invalid value for '{option}': 0 is not in the range x>=1" in done.output
