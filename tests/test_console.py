"""What the terminal shows: the epoch line, the per-bucket table, the UI links, the sweep's rows,
``train.py --help``, the library noise that must not appear — on hand-built inputs, and through the
real ``train.py`` on a tiny run with its progress bar on, on a pseudo-terminal (a pipe gets no bar:
tests/test_terminal_story.py)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_helpers import REPO, TRAIN_PY, clean_env, explain, outputs_under, run_cli, tiny

from attnseq.cli import config_help, quiet_libraries
from attnseq.tracking.store import ui_links
from attnseq.training.console import SAMPLES_TABLE, TrainingReport, bucket_table, epoch_line
from attnseq.training.sweep import job_table


# -- lines and tables ------------------------------------------------------------------------------
def test_epoch_line_shows_the_metrics_present_in_order():
    metrics = {"val/exact_match": 0.25, "train/loss": 1.23456, "val/acc": 0.5, "val/loss": 2.0,
               "val/exact_match_train_lengths": 0.75, "val/acc_len/01-05": 0.9}
    assert epoch_line(3, 12, metrics) == (
        "epoch  3/12  loss 1.235  val loss 2.000  acc 0.500  exact 0.250  exact@train lengths 0.750"
    )
    assert epoch_line(1, 1, {"train/loss": 1.0, "val/align_acc_train_lengths": 0.125}) == (
        "epoch 1/1  loss 1.000  align@train lengths 0.125")


def test_bucket_table_marks_training_lengths_and_empty_buckets():
    rows = [
        {"bucket": "01-05", "lo": 1, "hi": 5, "sequences": 14, "acc": 0.5, "exact_match": 0.25},
        {"bucket": "06-10", "lo": 6, "hi": 10, "sequences": 10, "acc": 0.125, "exact_match": 0.0},
        {"bucket": "11-12", "lo": 11, "hi": 12, "sequences": 0, "acc": None, "exact_match": None},
    ]
    assert bucket_table(rows, (1, 6)).splitlines() == [
        "  length     seqs     acc   exact",
        "* 01-05        14   0.500   0.250",
        "  06-10        10   0.125   0.000",
        "  11-12         0       -       -",
    ]


def test_the_last_bucket_table_is_printed_only_after_a_real_validation(capsys):
    """A run resumed after its last epoch validates only its sanity check's few batches: that partial
    table is not the run's, so nothing is printed; after a real validation the table is."""
    rows = [{"bucket": "01-05", "lo": 1, "hi": 5, "sequences": 2, "acc": 0.5, "exact_match": 0.5}]
    report = TrainingReport(SimpleNamespace(name="resumed"))
    trainer = SimpleNamespace(is_global_zero=True, sanity_checking=True)
    module = SimpleNamespace(last_bucket_tables={"val": rows}, train_lengths=(1, 6))
    report.on_validation_end(trainer, module)
    report.on_fit_end(trainer, module)
    assert bucket_table(rows, (1, 6)) not in capsys.readouterr().out
    trainer.sanity_checking = False
    report.on_validation_end(trainer, module)
    report.on_fit_end(trainer, module)
    assert bucket_table(rows, (1, 6)) in capsys.readouterr().out


def test_an_epoch_without_a_validation_of_its_own_shows_and_logs_no_validation_numbers(tmp_path):
    """``+trainer.check_val_every_n_epoch=2`` over 3 epochs: epoch 2 alone validates, so epochs 1 and 3
    print their training loss only (the last validation's numbers are epoch 2's), and the run's table of
    sample outputs holds epoch 2's samples alone, not a copy of them under epoch 3."""
    from mlflow.tracking import MlflowClient

    proc = run_cli(tmp_path, *tiny(max_epochs=3, heatmaps=False), "+trainer.check_val_every_n_epoch=2",
                   *outputs_under(tmp_path))
    assert proc.returncode == 0, explain(proc)
    lines = {int(m.group(1)): m.group(0) for m in re.finditer(r"^epoch (\d)/3 .*$", proc.stdout, re.M)}
    assert sorted(lines) == [1, 2, 3], proc.stdout
    assert "val loss" in lines[2] and "exact" in lines[2]
    for epoch in (1, 3):
        assert "loss" in lines[epoch] and "val loss" not in lines[epoch] and "exact" not in lines[epoch], lines
    client = MlflowClient(outputs_under(tmp_path)[0].split("=", 1)[1])
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    table = json.loads(Path(client.download_artifacts(run.info.run_id, SAMPLES_TABLE, str(tmp_path))).read_text())
    epochs = [row[table["columns"].index("epoch")] for row in table["data"]]
    assert epochs and set(epochs) == {2}


# -- UI links ----------------------------------------------------------------------------------------
def test_ui_links_for_a_relative_sqlite_store_use_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    links = ui_links("sqlite:///sub/mlflow.db", "7", "abc")
    assert links.open_with == f"mlflow ui --backend-store-uri sqlite:///{tmp_path.resolve()}/sub/mlflow.db --port 5000"
    assert links.url == "http://127.0.0.1:5000/#/experiments/7/runs/abc?workflowType=machine_learning"
    assert ui_links("sqlite:////data/m.db", "7", port=5001) == (
        "mlflow ui --backend-store-uri sqlite:////data/m.db --port 5001", "http://127.0.0.1:5001/#/experiments/7?workflowType=machine_learning")


def test_ui_links_for_a_server_are_its_own_pages_without_credentials():
    links = ui_links("https://alice:s3cret-pw@mlflow.example.org:8443/prefix", "2", "r1")
    assert links == (None, "https://mlflow.example.org:8443/prefix/#/experiments/2/runs/r1?workflowType=machine_learning")


def test_ui_links_for_a_database_mask_its_password():
    links = ui_links("postgresql://alice:s3cret-pw@db.example.org/mlflow", "2")
    assert links.open_with == "mlflow ui --backend-store-uri postgresql://***@db.example.org/mlflow --port 5000"


def test_job_table_has_one_row_per_job_sorted_by_name():
    def child(name, run_id, status, metrics):
        return SimpleNamespace(info=SimpleNamespace(run_name=name, run_id=run_id, status=status),
                               data=SimpleNamespace(metrics=metrics))

    children = [child("scorer=dot (#1)", "r2", "FAILED", {}), child("scorer=additive (#0)", "r1", "FINISHED",
                                                                     {"val/acc_best": 0.8125})]
    assert job_table(children, "val/acc_best", "4", "sqlite:////s/mlflow.db").splitlines() == [
        "job                   status     val/acc_best  url",
        "scorer=additive (#0)  FINISHED          0.812  http://127.0.0.1:5000/#/experiments/4/runs/r1?workflowType=machine_learning",
        "scorer=dot (#1)       FAILED                -  http://127.0.0.1:5000/#/experiments/4/runs/r2?workflowType=machine_learning",
    ]


# -- library noise -------------------------------------------------------------------------------------
def test_quiet_libraries_drops_only_the_known_chatter(caplog):
    undo = quiet_libraries()
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        rank_zero.info("💡 Tip: For seamless cloud logging, try installing litlogger")
        rank_zero.info("`Trainer.fit` stopped: `max_epochs=2` reached.")
        rank_zero.info("GPU available: False, used: False")
        rank_zero.info("Restoring states from the checkpoint path at last.ckpt")
    assert [r.getMessage() for r in caplog.records] == ["Restoring states from the checkpoint path at last.ckpt"]
    assert logging.getLogger("mlflow.store.db.utils").getEffectiveLevel() == logging.WARNING
    undo()  # the test process's loggers as they were, for the tests after this one


def test_lightnings_sigterm_notice_is_dropped_and_the_signal_named_by_attnseq(caplog):
    """attnseq stops Lightning's loop through its SIGTERM handler after a Ctrl-C too: Lightning's "Received
    SIGTERM: 15" would name the wrong signal, so it goes, and attnseq's own line names the one sent."""
    from attnseq.lifecycle.signals import signal_name

    undo = quiet_libraries()
    connector = logging.getLogger("lightning.pytorch.trainer.connectors.signal_connector")
    with caplog.at_level(logging.INFO, logger=connector.name):
        connector.info("[rank: 0] Received SIGTERM: 15")
        connector.info("Requeuing SLURM job 12 failed with error code 1")
    assert [r.getMessage() for r in caplog.records] == ["Requeuing SLURM job 12 failed with error code 1"]
    undo()
    with caplog.at_level(logging.INFO, logger=connector.name):
        connector.info("[rank: 0] Received SIGTERM: 15")
    assert caplog.records[-1].getMessage() == "[rank: 0] Received SIGTERM: 15"  # undone
    assert [signal_name(signal.SIGINT), signal_name(signal.SIGTERM), signal_name(None, KeyboardInterrupt()),
            signal_name(None, SystemExit(143))] == ["Ctrl-C", "SIGTERM", "Ctrl-C", "SIGTERM"]


def test_quiet_libraries_keeps_sacrebleus_bootstrap_lines_out_of_a_comparison_until_undone(caplog):
    """A comparison of text runs calls sacreBLEU's paired bootstrap once per pair of groups; each call logs
    its steps at INFO (Hydra's console shows INFO): nine lines a pair, none of them news to the user."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    references = [f"the cat number {i} sat on the mat" for i in range(20)]
    systems = [("a", references), ("b", [" ".join(reversed(r.split())) for r in references])]

    def bootstrap_lines() -> list[str]:
        caplog.clear()
        PairedTest(systems, {"bleu": BLEU()}, [references], test_type="bs", n_samples=20)()  # as attnseq calls it
        return [r.getMessage() for r in caplog.records if r.name.startswith("sacrebleu")]

    with caplog.at_level(logging.INFO), caplog.at_level(logging.NOTSET, logger="sacrebleu"):  # as in a job's
        undo = quiet_libraries()  # logging: the root at INFO (Hydra's), sacreBLEU's own level not set
        assert bootstrap_lines() == []
        undo()
        assert logging.getLogger("sacrebleu").level == logging.NOTSET
        assert bootstrap_lines() != []  # what the quieting hides is there: the check can fail


def test_quiet_libraries_ignores_the_leafspec_warning_only_from_lightning():
    message = "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)` instead."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_libraries()
        warnings.warn_explicit(message, FutureWarning, "_pytree.py", 21, module="lightning.pytorch.utilities._pytree")
        warnings.warn_explicit(message, FutureWarning, "mine.py", 1, module="my_package.mine")
    assert [w.filename for w in caught] == ["mine.py"]


# -- --help --------------------------------------------------------------------------------------------
def test_config_help_lists_every_group_option_and_the_keys_meanings():
    text = config_help("train")
    for group in ("dataset", "encoder", "scorer", "decoder", "trainer"):
        options = sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml"))
        assert options, group
        for option in options:
            assert re.search(rf"^ {{3}}[* ] {re.escape(option)}\b", text, re.MULTILINE), (group, option)
    assert re.search(r"^ {3}\* additive +Bahdanau", text, re.MULTILINE)  # the default, with its file's comment
    assert re.search(r"^  model\.heads = 1 +attention heads", text, re.MULTILINE)
    assert re.search(r"^  dataset\.train_lengths = \[1, 15\]", text, re.MULTILINE)
    assert re.search(r"^  dataset\.task = copy +copy \| reverse", text, re.MULTILINE)  # the option's value wins


HEAVY = {"torch", "lightning", "mlflow", "numpy", "pandas", "sqlalchemy", "matplotlib", "scipy"}
"""What --help must answer before: each takes from a fraction of a second to seconds to import."""


def test_train_help_answers_before_the_heavy_imports(tmp_path):
    """Fast because nothing heavy is imported (what ``-X importtime`` lists), whatever the machine's
    load; the time itself is measured by benchmarks/startup.py."""
    proc = subprocess.run([sys.executable, "-X", "importtime", str(TRAIN_PY), "--help"], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, explain(proc)
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "hydra" in imported  # the list is read right: the config is composed from it
    assert not HEAVY & {name.split(".")[0] for name in imported}, imported
    assert proc.stdout.strip() == config_help("train").strip()
    assert not list(tmp_path.iterdir())  # no store, no outputs folder


def help_keys(text: str) -> dict[str, str]:
    """``--help``'s key lines: dotted key → what follows its `` = `` (the default, then the meaning)."""
    return {key.strip(): rest for line in text.splitlines() if line.startswith("  ") and " = " in line
            for key, rest in [line.split(" = ", 1)]}


def yaml_text(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("group, option", [("decoder", "transformer"), ("lr_schedule", "noam"),
                                           ("lr_schedule", "inverse_sqrt")])
def test_train_help_lists_the_keys_of_an_option_named_on_the_command_line(tmp_path, group, option):
    """``train.py decoder=transformer --help`` lists that option's keys (decoder.layers, …, the scheduler's
    warmup) with its file's defaults and a meaning each, not the default option's; the options it
    overrides follow it (decoder=transformer's scorer=multihead) unless the command line names them."""
    import yaml

    def keys(*args: str) -> dict[str, str]:
        proc = subprocess.run([sys.executable, str(TRAIN_PY), *args, "--help"], cwd=tmp_path, env=clean_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, explain(proc)
        return help_keys(proc.stdout)

    prefix = "scheduler" if group == "lr_schedule" else group  # lr_schedule's files set scheduler.*

    def settings_of(name: str) -> dict:
        settings = yaml.safe_load((REPO / "conf" / group / f"{name}.yaml").read_text())
        return {f"{prefix}.{key}": value for key, value in (settings.get(prefix) or settings).items()
                if not key.startswith("_") and key != "defaults"}

    [default] = [entry[group] for entry in yaml.safe_load((REPO / "conf" / "train.yaml").read_text())["defaults"]
                 if isinstance(entry, dict) and group in entry]
    own, default_keys = settings_of(option), set(settings_of(default))
    assert default_keys <= set(keys())  # plain --help: the default option's keys
    listed = keys(f"{group}={option}")
    for key, value in own.items():
        assert key in listed, (key, sorted(listed))
        rest = listed[key]
        assert rest.startswith(yaml_text(value)), (key, rest)
        if key != f"{group}.convention":  # every setting of the option says what it is
            assert rest[len(yaml_text(value)):].strip(), key
    assert not (default_keys - set(own)) & set(listed)  # the default option's other keys are gone
    if option == "transformer":
        assert listed["scorer.name"].startswith("multihead")  # conf/decoder/transformer.yaml's override
        # the command line wins
        assert keys(f"{group}={option}", "scorer=additive")["scorer.name"].startswith("additive")


# -- through the real train.py -----------------------------------------------------------------------
NOISE = ("litlogger", "LeafSpec", "FLOPs", "Trainer.fit` stopped", "INFO mlflow", "alembic", "v_num",
         "`srun` command")  # the last where Slurm is installed (the suite's own Slurm cluster installs it)


def run_on_a_terminal(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``train.py`` with its stdout on a pseudo-terminal (as in a user's shell), stderr in a file."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 24 rows of 120 columns
    with open(root / "stderr.txt", "w+") as stderr:
        child = subprocess.Popen([sys.executable, str(TRAIN_PY), *args], cwd=root, env=clean_env(),
                                 stdin=subprocess.DEVNULL, stdout=terminal, stderr=stderr)
        os.close(terminal)
        chunks = []
        while select.select([controller], [], [], timeout)[0]:
            try:
                chunk = os.read(controller, 1 << 16)
            except OSError:  # EIO: the child has closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(controller)
        child.wait(timeout=timeout)
        stderr.seek(0)
        return subprocess.CompletedProcess(child.args, child.returncode, b"".join(chunks).decode(), stderr.read())


@pytest.mark.slow
def test_a_run_prints_its_epochs_table_and_url_without_library_noise(tmp_path):
    proc = run_on_a_terminal(tmp_path, *tiny(), "trainer.enable_progress_bar=true",
                             "trainer.enable_model_summary=true", *outputs_under(tmp_path))
    assert proc.returncode == 0, explain(proc)
    out = proc.stdout.replace("\r\n", "\n").replace("\r", "\n")
    assert re.search(r"^Training '.+': [\d,]+ parameters \([\d,]+ trainable\), 2 epochs, on cpu$", out, re.M), out
    metric = r"\d\.\d{3}"
    for epoch in (1, 2):
        line = rf"^epoch {epoch}/2  loss {metric}  val loss {metric}  acc {metric}  exact {metric}  " \
               rf"exact@train lengths {metric}  align@train lengths {metric}  \(.+\)$"
        assert len(re.findall(line, out, re.M)) == 1, out
        assert re.search(rf"^Epoch {epoch}/2: +\d+%", out, re.M), out  # the bar counts epochs as the lines do
    assert not re.search(r"^Epoch 0", out, re.M), out
    assert re.search(r"val_exact=\d\.\d{3}, val_acc=\d\.\d{3}", out), out  # on the bar
    assert re.search(rf"^\* 01-05 +\d+ +{metric} +{metric}\n  06-10 +\d+ +{metric} +{metric}\n  11-12 ", out, re.M)
    store = (tmp_path / "mlflow.db").resolve()
    assert f"Open it with: mlflow ui --backend-store-uri sqlite:///{store} --port 5000" in out
    page = r"then: +http://127\.0\.0\.1:5000/#/experiments/\d+/runs/[0-9a-f]{32}\?workflowType=machine_learning$"
    assert re.search(page, out, re.M), out
    for noise in NOISE:
        assert noise not in proc.stdout + proc.stderr, noise


@pytest.mark.parametrize("full_error", [False, True])
def test_a_misspelt_option_exits_2_quickly(tmp_path, full_error):
    env = {k: v for k, v in clean_env().items() if k != "HYDRA_FULL_ERROR"}
    if full_error:
        env["HYDRA_FULL_ERROR"] = "1"
    proc = run_cli(tmp_path, "scorer=dott", *outputs_under(tmp_path), env=env, timeout=120)
    if full_error:  # the traceback asked for: Hydra's own report
        assert proc.returncode == 1 and "Traceback" in proc.stderr, explain(proc)
        return
    assert proc.returncode == 2, explain(proc)
    assert "Did you mean scorer=dot?" in proc.stderr and "Traceback" not in proc.stderr
    assert not (Path(tmp_path) / "mlflow.db").exists()


def test_library_lines_are_dropped_and_never_formatted(tiny_run):
    """Lightning's start-up lines (seed, accelerators), which attnseq's start line replaces, are not
    printed, and none of Lightning's lines goes through the run log's formatter
    (``[date][logger][INFO] - …``), whatever the order the entry point composes, validates and imports in."""
    output = tiny_run.proc.stdout + tiny_run.proc.stderr
    for line in ("Seed set to", "GPU available:", "TPU available:", "val_check_interval"):
        assert line not in output, output[:3000]
    assert not re.search(r"^\[\d{4}-\d\d-\d\d [\d:,]+\]\[lightning", output, re.M), output[:3000]
