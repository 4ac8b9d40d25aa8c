"""The benchmark's quick mode (benchmarks/bench.py --quick): every case trains through both loops
and the baseline, every variant of the full run trains, and the report has every row. The
performance targets themselves depend on the machine and are checked by the full run
(benchmarks/results.md), not here."""

from __future__ import annotations

import argparse
import importlib
import itertools
import math
import sys
from pathlib import Path

import pytest
from benchmark_scripts import imported  # tests/ on sys.path

from attnseq.attention import NO_ATTENTION, SCORERS
from attnseq.config import validate_train
from attnseq.errors import ConfigError
from attnseq.training.build import check_with_libraries

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    """benchmarks/bench.py imported as the script sees its siblings (its folder first on sys.path)."""
    with imported("bench") as module:
        yield module


@pytest.fixture(scope="module")
def cases(bench):
    return sys.modules["cases"]


@pytest.fixture(scope="module")
def quick(bench, tmp_path_factory):
    args = argparse.Namespace(quick=True, device="cpu", threads=1, compile=False)
    settings = bench.make_settings(args)
    results = bench.run(settings, log=lambda line: None, workdir=tmp_path_factory.mktemp("bench"))
    return settings, results, bench.render(results, "python benchmarks/bench.py --quick")


def finite_positive(value) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def conf_options(group: str) -> set[str]:
    return {path.stem for path in (REPO / "conf" / group).glob("*.yaml")}


def test_the_quick_cases_cover_every_scorer_decoder_and_encoder(bench, cases):
    quick = bench.quick_cases()
    assert {c.scorer for c in quick} == {*SCORERS, NO_ATTENTION}
    assert {c.decoder for c in quick} == set(cases.DECODERS)
    assert {c.encoder for c in quick} == conf_options("encoder")
    assert len(quick) == len(set(quick))


@pytest.mark.slow
def test_the_full_matrix_is_every_combination_the_config_accepts(bench, cases):
    """Every registered scorer × decoder × encoder is a case unless the checks train.py runs before
    it opens the store reject it; without attention, one case per encoder."""
    full = bench.all_cases()
    expected = {cases.Case(encoder, NO_ATTENTION) for encoder in conf_options("encoder")}
    for encoder, scorer, decoder in itertools.product(conf_options("encoder"), SCORERS, cases.DECODERS):
        case = cases.Case(encoder, scorer, decoder)
        try:
            check_with_libraries(validate_train(cases.composed(case)))
        except ConfigError:
            continue
        expected.add(case)
    assert len(full) == len(set(full))
    assert set(full) == expected


@pytest.mark.slow
def test_every_case_trains_through_the_real_path_the_minimal_loop_and_the_baseline(quick):
    settings, results, _ = quick
    rows = results.rows
    for case in settings.cases:
        row = rows[case.name]
        assert len(row.rates["real"]) == settings.windows, case.name
        for loop in ("real", "minimal", "textbook"):
            assert finite_positive(row.median(loop)), (case.name, loop)
        assert row.activations > 0
    assert finite_positive(rows["textbook"].median("minimal"))
    assert finite_positive(rows["textbook"].median("random"))


def test_padding_and_decoding_are_measured(quick):
    _, results, _ = quick
    assert 0 <= results.padding["bucketed"] < results.padding["random"] < 1
    for entry in results.decoding.values():
        assert finite_positive(entry["seq_s"]) and finite_positive(entry["tok_s"])


def test_the_transformer_is_measured_beside_nn_transformer_on_the_same_batches(quick):
    """attnseq's encoder=transformer decoder=transformer and the plain nn.Transformer model: trained in
    lock step on the same batches from the same weights (so the same losses), the parameters equal but
    for what differs by design, decoded to the same greedy output, every rate measured and reported."""
    settings, results, report = quick
    reference_module = sys.modules["transformer_reference"]
    reference = reference_module.REFERENCE
    found = results.transformer
    assert found["same_tokens"] and found["steps"] == settings.steps and found["tokens"] > 0
    for ours, theirs in found["losses"]:  # the first step's and the last's: one function, trained alike
        assert math.isfinite(ours) and ours == pytest.approx(theirs, rel=1e-4)
    params, d = found["parameters"], settings.sizes[1]
    layers = found["config"]["layers"]
    assert params["bridge"] == d * d + d  # Linear(d, model.layers · d), model.layers = 1
    assert params["key_biases"] == (layers + 2 * layers) * d  # encoder self-, decoder self- and cross-attention
    assert params[reference] == params["attnseq"] - params["bridge"] + params["key_biases"]
    for row, loop in ((found["label"], "real"), (found["label"], "minimal"), (reference, "minimal")):
        measured = results.rows[row]
        assert len(measured.rates[loop]) == settings.windows and finite_positive(measured.median(loop))
        assert finite_positive(measured.ratio(loop))  # against this run's textbook baseline
    assert finite_positive(results.transformer_ratio("minimal")) and finite_positive(results.transformer_ratio("real"))
    decoded = found["decoding"]
    assert decoded["same greedy output"] == decoded["sequences"] > 0
    runs = {name: entry for name, entry in decoded.items() if isinstance(entry, dict)}
    assert len(runs) == 5 and any("beam 5" in name and results.decode_case in name for name in runs)
    greedy = [entry["tokens"] for name, entry in runs.items() if "greedy" in name and results.decode_case not in name]
    assert len(greedy) == 2 and greedy[0] == greedy[1]
    section = report.split("## The Transformer beside nn.Transformer")[1].split("## Targets")[0]
    for name in runs:
        (line,) = [line for line in section.splitlines() if line.startswith(f"| {name} |")]
        assert "—" not in line, line
    assert sum(line.startswith("| attnseq, ") for line in section.splitlines()) == 2


def test_the_report_has_every_row_and_every_target(quick):
    settings, results, report = quick
    report_module = sys.modules["report"]
    training = report.split("## Training throughput")[1].split("## Padding")[0]
    table = [line for line in training.splitlines() if line.startswith("| ")]
    for case in settings.cases:
        (line,) = [row for row in table if row.startswith(f"| {case.name} |")]
        assert "—" not in line.split("|")[2:7], line  # real, ×base, minimal, ×base, overhead
    for heading in ("## Training throughput", "## Padding and length bucketing", "## Decoding", "## Targets"):
        assert heading in report
    targets = report.split("## Targets")[1]
    expected = report_module.targets(results)
    assert expected, "no target checked"
    for line in expected:  # each target the results are checked against (the quick mode measures some)
        assert line in targets.splitlines(), line
    assert any("goal" in line for line in expected)  # at least one is measured here and checked
    for field in ("commit", "machine"):
        assert report_module.header_field(report, field), field


@pytest.mark.slow
def test_every_variant_trains_and_is_reported_against_its_case(bench, cases, tmp_path):
    """The full run's variants (fast paths off, config overrides), at the quick mode's sizes."""
    quick = bench.make_settings(argparse.Namespace(quick=True, device="cpu", threads=1, compile=False))
    variants = cases.VARIANTS
    varied = [case for case in bench.all_cases() if case in {variant.case for variant in variants}]
    settings = bench.Settings(**{**vars(quick), "cases": varied, "ablations": True})
    unfast = [cases.without_fast_paths(case) for case in varied if cases.in_slow_family(case)]
    assert unfast and settings.variants() == variants + unfast

    results = bench.run(settings, log=lambda line: None, workdir=tmp_path)
    report = bench.render(results, "test")

    tried = report.split("## What was tried")[1].split("## Decoding")[0]
    for variant in variants:
        row = results.rows[variant.label]
        assert (row.kept, row.varies) == (variant.case.name, variant.loop)
        assert finite_positive(row.median(variant.loop)) and finite_positive(row.ratio(variant.loop))
        (line,) = [line for line in tried.splitlines() if line.startswith(f"| {variant.label} |")]
        assert "—" not in line.split("|")[3:6], line  # tok/s, ×base, vs kept


def test_the_next_report_keeps_the_previous_ratios_beside_its_own(bench, quick):
    settings, results, report = quick
    report_module = sys.modules["report"]
    previous = report_module.previous_ratios(report)
    assert previous is not None and previous.commit != "unknown"
    for case in settings.cases:  # read back exactly as written
        assert previous.ratios[case.name] == report_module.fmt_ratio(results.rows[case.name].ratio("real"))
    previous.ratios.pop(settings.cases[-1].name)  # a case the earlier report did not have
    again = bench.render(results, "again", previous)
    header = f"×base at {previous.commit}"
    table = [line for line in again.split("## Training throughput")[1].split("## Padding")[0].splitlines()
             if line.startswith("| ")]
    columns = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert columns[3] == header
    for case in settings.cases:
        (line,) = [row for row in table if row.startswith(f"| {case.name} |")]
        cell = line.strip("|").split("|")[3].strip()
        assert cell == previous.ratios.get(case.name, "—")
    assert report_module.previous_ratios("# nothing here\n") is None


def test_a_report_written_elsewhere_compares_with_the_one_named(bench, quick, tmp_path, capsys):
    """``--out`` outside benchmarks/results.md still gets the ``×base at`` column: from ``--compare``'s report."""
    earlier = tmp_path / "earlier.md"
    earlier.write_text(quick[2])
    commit = sys.modules["report"].previous_ratios(quick[2]).commit
    out = tmp_path / "out.md"
    assert bench.main(["--quick", "--threads", "1", "--out", str(out), "--compare", str(earlier)]) == 0
    header = out.read_text().split("## Training throughput")[1].splitlines()
    assert f"×base at {commit}" in next(line for line in header if line.startswith("| "))
    assert bench.main(["--quick", "--threads", "1", "--out", str(tmp_path / "alone.md")]) == 0  # --quick: no default
    assert "×base at" not in (tmp_path / "alone.md").read_text()
    capsys.readouterr()


def test_the_previous_ratios_footnote_names_another_processor(bench, quick):
    _, results, report = quick
    report_module = sys.modules["report"]
    previous = report_module.previous_ratios(report)
    processor = report_module.processor_of(results.machine)
    assert processor and previous.processor == processor  # read back from the machine line
    same = report_module.previous_note(previous, results.machine)
    assert previous.commit in same and processor not in same  # the same processor: nothing to warn about
    elsewhere = report.replace(f"cores ({processor})", "cores (AMD EPYC 7B13)")
    earlier = report_module.previous_ratios(elsewhere)
    assert earlier.processor == "AMD EPYC 7B13"
    note = report_module.previous_note(earlier, results.machine)
    assert earlier.commit in note and "AMD EPYC 7B13" in note and processor in note  # both processors named
    assert note in bench.render(results, "again", earlier)
    assert report_module.processor_of("2 cores, device cpu") == ""
    line = "2 cores (Intel(R) Xeon(R) Processor), GPU NVIDIA H200, device cuda, torch 2.13.0"
    assert report_module.processor_of(line) == "Intel(R) Xeon(R) Processor"


def test_what_users_wait_on_goes_between_the_tables_and_the_targets(bench, quick):
    waits = sys.modules["waits"]
    _, results, _ = quick
    results.waits = {"startup": waits.Waited("## Start-up\n\n| a |\n", ["- `train.py --help`: **0.20 s**: met"])}
    try:
        report = bench.render(results, "test")
    finally:
        results.waits = {}
    assert report.index("## Decoding") < report.index("## Start-up") < report.index("## Targets")
    assert report.index("What users wait on:") < report.index("- `train.py --help`: **0.20 s**: met")
    met, missed = waits.verdict(0.2, 3.0, " s"), waits.verdict(1.3, 5.0, "×", at_most=False)
    assert "0.20 s" in met and "3 s" in met and "NOT met" not in met and met.endswith("met")
    assert "1.30×" in missed and "5×" in missed and missed.endswith("NOT met")
    assert waits.verdict(3.5, 3.0, " s").endswith("NOT met") and waits.verdict(5.0, 5.0, "×", at_most=False).endswith(
        ": met")


def test_the_slow_families_are_checked_against_their_goal(quick):
    settings, results, report = quick
    lstm = [case for case in settings.cases if case.encoder == "lstm"]
    assert lstm  # the quick cases hold some
    report_module = sys.modules["report"]
    targets = report.split("## Targets")[1]
    worst = min(lstm, key=lambda case: results.rows[case.name].ratio("real"))
    reached = sum(results.rows[case.name].ratio("real") >= report_module.SLOW_FAMILIES_GOAL for case in lstm)
    # the LSTM family's line (the slowest case may be named by another target's line too)
    (line,) = [line for line in targets.splitlines() if "LSTM" in line and f"of {len(lstm)} cases" in line]
    assert f"({worst.name})" in line, line  # the family's slowest, named
    assert f"{reached} of {len(lstm)}" in line, line
    assert f"{results.rows[worst.name].ratio('real'):.2f}×" in line and f"{report_module.SLOW_FAMILIES_GOAL:g}×" in line


def test_each_slow_family_case_runs_without_its_fast_paths_and_the_shortfall_is_read_from_the_rows(quick, cases):
    """Every slow-family case has a row of its model with every fast path off, from the same lock step; the table
    lists exactly the cases short of the goal, with the gain and the need computed from the rows' medians."""
    settings, results, report = quick
    report_module = sys.modules["report"]
    family = [case for case in settings.cases if cases.in_slow_family(case)]
    assert family and all(not cases.in_slow_family(case) for case in (cases.KEY_ADDITIVE, cases.KEY_DOT))
    assert all(getattr(cases.NO_FAST_PATHS, switch) is False for switch in vars(cases.NO_FAST_PATHS))
    goal = cases.SLOW_FAMILIES_GOAL
    section = report.split("## The slow families' cases short of")[1].split("\n## ")[0]
    largest = max(
        results.rows[case.name].median("minimal") / results.rows[cases.without_fast_paths(case).label].median("minimal")
        for case in family
    )
    assert f"{largest:.2f}×" in section.split("\n| ")[0]  # named above the table
    for case in family:
        row, unfast = results.rows[case.name], results.rows[cases.without_fast_paths(case).label]
        assert unfast.kept == case.name and finite_positive(unfast.ratio("minimal"))
        assert len(unfast.rates["minimal"]) == len(row.rates["minimal"]) == settings.windows  # the same windows
        real, minimal, off = (row.median("real"), row.median("minimal"), unfast.median("minimal"))
        base = row.median(report_module.BASELINE)
        needs = goal * (minimal / real) / (off / base)
        lines = [line for line in section.splitlines() if line.startswith(f"| {case.name} |")]
        if real / base >= goal:
            assert not lines
            continue
        (line,) = lines
        columns = [column.strip() for column in line.strip("|").split("|")]
        assert columns[4] == f"{minimal / off:.2f}×" and columns[5] == f"{needs:.2f}×", line
    tried = report.split("## What was tried")[1].split("\n## ")[0] if "## What was tried" in report else ""
    assert cases.WITHOUT_FAST_PATHS not in tried  # its own table, not an ablation's row


def test_a_shortfall_reads_as_bounded_short_or_unserved(bench):
    report_module = sys.modules["report"]
    Shortfall = report_module.Shortfall
    largest = Shortfall("gru/x/y", real=3.0, minimal=3.3, unfast=1.1)  # gain 3.0
    bounded = Shortfall("lstm/a/b", real=1.0, minimal=1.1, unfast=0.5)  # needs 1.8 · 1.1 / 0.5 = 3.96 > 3.0
    short = Shortfall("lstm/c/d", real=1.5, minimal=1.5, unfast=1.0)  # gain 1.5, needs 1.8
    unserved = Shortfall("lstm/e/f", real=1.6, minimal=1.6, unfast=1.58)  # gain 1.01
    assert bounded.needed == pytest.approx(3.96) and short.needed == pytest.approx(1.8)
    assert largest.gain == pytest.approx(3.0)
    assert [entry.kind(largest) for entry in (bounded, short, unserved)] == ["bounded", "short", "unserved"]
    assert bounded.kind(None) == "short"  # nothing else measured: nothing to be bounded by
    measured = [largest, bounded, short]
    assert report_module.largest_other(largest, measured) is bounded  # gain 2.2 over 1.5: never the case itself
    assert report_module.largest_other(bounded, measured) is largest
    assert report_module.largest_other(bounded, [bounded]) is None
    assert "3.96×" in report_module.shortfall_reading(bounded, largest)
    assert "1.50×" in report_module.shortfall_reading(short, largest)


def test_sections_are_named_from_the_registry(bench):
    waits = sys.modules["waits"]
    assert bench.section_names("all") == list(waits.SECTIONS)
    assert bench.section_names("startup,evaluation") == ["startup", "evaluation"]
    assert bench.section_names("none") == []
    with pytest.raises(argparse.ArgumentTypeError, match="unknown section.*use 'all', 'none'"):
        bench.section_names("startup,warp-drive")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--sections", "warp-drive"])
    assert exit_info.value.code == 2


def test_a_case_is_named_as_the_report_names_it(bench):
    """``--case encoder/scorer/decoder``: a case of the matrix, with what was tried on it; a name that is none
    is refused with one that is."""
    cases = sys.modules["cases"]
    assert bench.case_named("lstm/dot/bahdanau") == cases.Case("lstm", "dot", "bahdanau")
    with pytest.raises(argparse.ArgumentTypeError, match="e.g. gru/dot/bahdanau"):
        bench.case_named("lstm/dot/bahdanu")
    settings = bench.make_settings(argparse.Namespace(
        quick=False, case=[bench.case_named("gru/general/bahdanau")], cases="all", warmup=1, window=2, windows=1,
        threads=1, device="cpu", compile=False, sections=[]))
    assert settings.cases == [cases.Case("gru", "general", "bahdanau")]
    assert [variant.what for variant in settings.variants()] == ["multiplicative recurrence under autograd"]


def test_the_launch_cost_times_each_phase_by_cpu_and_renders_the_ratio(tmp_path, monkeypatch):
    """``startup.py --launch-cost``'s timing: a phase's functions are wrapped as their module is imported
    (a caller that imported the name first gets the wrapped one), a call nested in itself counts once, and
    the table sets two checkouts side by side with their ratio."""
    import json
    import subprocess

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    startup = importlib.import_module("startup")
    sys.modules.pop("startup")  # benchmarks/startup.py, not to be found under that name by another test
    (tmp_path / "busy.py").write_text(
        "import time\n"
        "def spin(seconds, again=True):\n"
        "    began = time.process_time()\n"
        "    while time.process_time() - began < seconds:\n"
        "        pass\n"
        "    if again:\n"
        "        spin(seconds, again=False)\n"
    )
    (tmp_path / "outer.py").write_text(
        "from busy import spin\ndef outer():\n    spin(0.2)\n    spin(0.1, again=False)\n")
    (tmp_path / "script.py").write_text("from busy import spin\nfrom outer import outer\nspin(0.2)\nouter()\n")
    phases = [("spinning", ["busy:spin"]), ("importing busy", ["busy:<import>"]), ("outer", ["outer:outer"])]
    out = tmp_path / "phases.json"
    for clock in ("process_time", "perf_counter"):
        subprocess.run([sys.executable, "-c", startup.TIMED_CHILD, str(out), clock, json.dumps(phases),
                        str(tmp_path / "script.py")], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, check=True)
        measured = json.loads(out.read_text())
        spinning, importing, outer = measured["phases"]
        # the spins: 0.4 + 0.4 + 0.1 s of CPU, each recursive one counted once; the outer call holds 0.5 of them
        assert 0.85 <= spinning and importing < spinning, clock
        assert clock == "perf_counter" or spinning < 5 * 0.9  # CPU; a busy machine's wall has no bound
        assert 0.45 <= outer <= spinning and measured["own"][2] < 0.1 * outer, clock  # its own: the calls alone
        assert measured["own"][0] == pytest.approx(spinning)  # nothing timed inside the spins
        assert measured["total" if clock == "process_time" else "wall"] >= spinning

    results = {"tries": 1, "overrides": ["trainer.max_epochs=1"], "env": {}, "cpu_s": {"this": [3.0], "against": [4.0]},
               "checkouts": {"this": "/a", "against": "/b"},
               "phases": {"this": {"spinning": [1.0]}, "against": {"spinning": [2.0]}}}
    table = startup.render_launch_cost(results)
    assert "| CPU s per launch | 3.00 | 4.00 | 0.75× |" in table and "| spinning | 1.00 | 2.00 | 0.50× |" in table


def test_a_commands_exit_is_timed_from_its_last_line_and_rendered_per_checkout(tmp_path, monkeypatch):
    """``startup.py --exits``: a command that prints its last line, then spends 0.3 s in an exit handler, is
    timed to that line and to its exit, at least 0.3 s apart; a failing command raises with its output; the
    table gives each command and checkout its medians."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    startup = importlib.import_module("startup")
    sys.modules.pop("startup")
    script = tmp_path / "slow_exit.py"
    script.write_text("import atexit, time\natexit.register(time.sleep, 0.3)\nprint('first')\nprint('last')\n")
    last, ended = startup.timed_lines([sys.executable, str(script)], tmp_path, tmp_path)
    assert 0 < last and ended - last >= 0.3
    script.write_text("import sys\nprint('went wrong')\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match="exited 3:\n.*went wrong"):
        startup.timed_lines([sys.executable, str(script)], tmp_path, tmp_path)
    results = {"tries": 3, "checkouts": {"this": "/a", "against": "/b"},
               "seconds": {"translate.py": {"this": [(4.0, 4.2), (3.0, 3.1), (5.0, 5.3)],
                                            "against": [(4.0, 5.0), (4.5, 5.4), (3.5, 4.7)]}}}
    table = startup.render_exits(results)
    assert "| `translate.py` | this (`/a`) | 4.00 | 0.20 | 4.20 |" in table
    assert "| `translate.py` | against (`/b`) | 4.00 | 1.00 | 5.00 |" in table


def test_the_new_store_launches_render_each_checkout_and_the_ratios(monkeypatch):
    """``startup.py --new-store``: each checkout's medians, and this one's over the other's with Welch's p."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    startup = importlib.import_module("startup")
    sys.modules.pop("startup")
    results = {"tries": 3, "checkouts": {"this": "/a", "against": "/b"},
               "first_step_s": {"this": [5.0, 5.2, 5.1], "against": [6.0, 7.0, 6.5]},
               "wall_s": {"this": [10.0, 11.0, 12.0], "against": [12.0, 12.0, 12.0]},
               "cpu_s": {"this": [16.0, 16.0, 16.0], "against": [14.0, 15.0, 13.0]}}
    table = startup.render_new_store(results)
    assert "| this (`/a`) | 5.10 | 11.00 | 16.00 |" in table and "| against (`/b`) | 6.50 | 12.00 | 14.00 |" in table
    assert "- first step: this / against **0.78×** (Welch p = " in table
    assert "- CPU: this / against **1.14×**" in table
    startup_table = startup.render({"tries": 3, "help": [0.3, 0.4, 0.5], "first_step": [4.0, 5.0, 6.0],
                                    "first_step_new_store": [7.0, 5.0, 6.0],
                                    "ui": {command: [2.0, 2.0, 2.0] for command in startup.UI_COMMANDS}})
    assert "| first training step, a new store | 6.00 |" in startup_table  # the median of its own tries


def test_a_failing_section_is_reported_and_the_next_still_runs(bench, monkeypatch):
    """An hour's full run is not lost to one section: its failure is in the report, the sections after it run."""
    waits = sys.modules["waits"]
    ran, logged = [], []

    def broken(threads, log):
        raise RuntimeError("the tracking server went away\nsecond line")

    def fine(threads, log):
        ran.append(threads)
        return waits.Waited("## Fine\n", ["- fine: met"])

    monkeypatch.setattr(waits, "SECTIONS", {"broken": broken, "fine": fine})
    waited = waits.run_sections(["broken", "fine"], 2, logged.append)
    assert ran == [2] and waited["fine"].targets == ["- fine: met"]
    assert "RuntimeError: the tracking server went away" in waited["broken"].markdown
    (target,) = waited["broken"].targets  # one line in the targets, naming the section and its error
    assert "broken" in target and "RuntimeError" in target and "second line" not in target
    assert any("Traceback" in line for line in logged)


def test_time_to_accuracy_states_the_ratio_issue_28_names(bench, monkeypatch):
    """The section's targets give the CLI's time over the textbook's against the goal, from the medians."""
    waits = sys.modules["waits"]
    tta = importlib.import_module("time_to_accuracy")
    seconds = {"cli": (20.0, 24.0, 30.0), "textbook": (40.0, 50.0, 60.0)}
    found = [tta.Attempt(who, seed, [(s, 500, 0.97)], s + 3) for who, times in seconds.items()
             for seed, s in enumerate(times)]
    found += [tta.Attempt(who, 0, [(99.0, 900, 0.5)], 100.0) for who in tta.BATCHINGS]  # never reached
    monkeypatch.setattr(tta, "measure", lambda settings, log: found)
    targets = waits.time_to_accuracy(1, lambda line: None).targets
    (versus,) = [line for line in targets if "textbook (issue 28" in line]
    assert f"**{24.0 / 50.0:.2f}×**" in versus and f"{waits.TEXTBOOK_GOAL:g}×" in versus and versus.endswith(": met")
