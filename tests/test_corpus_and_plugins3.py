"""Issue 23, points 7 and 10 (corpus, plugins, long lines): a corpus rebuild replaces the splits and
``corpus.json`` as one set and stops cleanly on SIGTERM/Ctrl-C; a bad ``--out`` exits 2 before any
catalog is read; a plugin that raises or exits at import is a config error naming it; a run's
plugins are imported by evaluate.py only when named; an over-long line never reaches a tokenizer;
``experiment=messages_en_fr`` trains on the corpus the builder wrote under the working directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from cli_helpers import (  # noqa: E402
    BUILD_CORPUS_PY,
    EVALUATE_PY,
    REPO,
    all_runs,
    clean_env,
    explain,
    outputs_under,
    run_cli,
    tiny,
    tracking_uri,
    user_env,
)
from mlflow.tracking import MlflowClient
from mo_writer import write_mo  # noqa: E402

from attnseq.data.errors import DataError
from attnseq.data.tsv import read_split_folder

CORPUS_FILES = ["corpus.json", "test.tsv", "train.tsv", "val.tsv"]
DEADLINE_S = 120.0

PAUSE_HOOK = '''
"""Pauses the corpus builder when it opens the validation split for writing (the training split is
written by then), until a signal's handler raises: the test signals it at that known moment."""
import builtins
import os
import time

_open = builtins.open


def _pausing_open(file, mode="r", *args, **kwargs):
    if "w" in mode and "val.tsv" in os.path.basename(str(file)):
        print("PAUSED", flush=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.02)
    return _open(file, mode, *args, **kwargs)


builtins.open = _pausing_open
'''


def locale_tree(root: Path) -> Path:
    write_mo(root / "fr" / "LC_MESSAGES" / "tool.mo",
             [(f"Message number {i}", f"Message numéro {i}") for i in range(60)] + [("Open file", "Ouvrir")])
    return root


def old_corpus(folder: Path) -> dict[str, bytes]:
    folder.mkdir(parents=True)
    for name in CORPUS_FILES:
        (folder / name).write_bytes(f"old {name}\tancien\n".encode())
    return {name: (folder / name).read_bytes() for name in CORPUS_FILES}


def contents(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def build(*args: str, env: dict | None = None, timeout: float = DEADLINE_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BUILD_CORPUS_PY), *args], capture_output=True, text=True,
                          timeout=timeout, env=env or clean_env() | {"PYTHONPATH": str(REPO)})


# -- point 7: the corpus builder -------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_build_keeps_the_old_corpus_whole_and_leaves_nothing_beside_it(signum, tmp_path):
    locale_dir, data = locale_tree(tmp_path / "locale"), tmp_path / "data"
    out = data / "messages_en-fr"
    before = old_corpus(out)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(PAUSE_HOOK)
    env = clean_env() | {"PYTHONPATH": os.pathsep.join([str(hook), str(REPO)])}
    command = [sys.executable, str(BUILD_CORPUS_PY), "--locale-dir", str(locale_dir), "--out", str(out)]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        lines = []
        for line in proc.stdout:  # the pause lasts until the signal (120 s at most), then the process ends
            lines.append(line)
            if line.strip() == "PAUSED":
                break
        assert lines and lines[-1].strip() == "PAUSED", "".join(lines) + proc.stderr.read()
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 128 + signum, (proc.returncode, stdout, stderr)
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert contents(out) == before  # not one new split beside the old ones
    assert [path.name for path in data.iterdir()] == ["messages_en-fr"]  # no folder or .partial left

    killed = data / ".messages_en-fr.4194999-0badf00d.building"  # left by a SIGKILLed build (pid above pid_max)
    killed.mkdir()
    (killed / "train.tsv").write_text("half\tmoitié\n")
    done = build("--locale-dir", str(locale_dir), "--out", str(out))
    assert done.returncode == 0, done.stderr
    after = contents(out)
    assert sorted(after) == CORPUS_FILES and all(after[name] != before[name] for name in CORPUS_FILES)
    assert [path.name for path in data.iterdir()] == ["messages_en-fr"]


def test_the_messages_preset_trains_on_the_corpus_built_in_the_working_directory(tmp_path):
    """Its ``dataset.path`` is ``${hydra:runtime.cwd}/data/messages_en-fr``, where ``make messages-corpus``
    writes: the checks made before Hydra's run read that path as the run will, in a sweep too."""
    (tmp_path / "data").mkdir()
    built = build("--locale-dir", str(locale_tree(tmp_path / "locale")), "--out",
                  str(tmp_path / "data" / "messages_en-fr"))
    assert built.returncode == 0, explain(built)
    small = ["dataset.train_size=32", "dataset.val_size=4", "dataset.test_size=4", "dataset.vocab_size=60",
             "model.hidden_size=16", "model.embedding_dim=8", "trainer.max_epochs=1",
             "trainer.enable_progress_bar=false", "tracking.heatmap_samples=0"]
    proc = run_cli(tmp_path, "-m", "experiment=messages_en_fr", "seed=0,1", *small,
                   *outputs_under(tmp_path, seeded=True))
    assert proc.returncode == 0, explain(proc)
    runs = all_runs(MlflowClient(tracking_uri(tmp_path)), "messages_en_fr")
    trained = [r for r in runs if "dataset.path" in r.data.params]
    assert len(trained) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    assert {r.data.params["dataset.path"] for r in trained} == {str(tmp_path / "data" / "messages_en-fr")}


@pytest.mark.parametrize("case", ["a file", "a missing parent", "a folder of other files"])
def test_a_bad_out_exits_2_before_reading_any_catalog(case, tmp_path):
    """The one catalog is a FIFO nobody writes: reading it would block until the timeout."""
    catalogs = tmp_path / "locale" / "fr" / "LC_MESSAGES"
    catalogs.mkdir(parents=True)
    os.mkfifo(catalogs / "blocking.mo")
    out = tmp_path / "out"
    if case == "a file":
        out.write_text("keep me\n")
    elif case == "a missing parent":
        out = tmp_path / "no" / "such" / "out"
    else:
        out.mkdir()
        (out / "notes.txt").write_text("keep me\n")
    done = build("--locale-dir", str(tmp_path / "locale"), "--out", str(out), timeout=30)
    assert done.returncode == 2, explain(done)
    assert done.stderr.startswith("error: --out ") and "Fix:" in done.stderr and "Traceback" not in done.stderr
    if case == "a file":
        assert out.read_text() == "keep me\n"
    elif case == "a missing parent":
        assert not (tmp_path / "no").exists()
    else:
        assert contents(out) == {"notes.txt": b"keep me\n"}


def swap_in(folder: Path, files: dict[str, str]) -> None:
    """What a rebuild does to a corpus folder: a new folder renamed into its place, the old one deleted."""
    new, old = folder.with_name("new"), folder.with_name("old")
    new.mkdir()
    for name, text in files.items():
        (new / name).write_text(text)
    if folder.exists():
        folder.rename(old)
    new.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def test_a_reader_never_gets_splits_of_two_builds(tmp_path, monkeypatch):
    """A rebuild that lands between the reads of two splits: the reader gets the old set or a
    DataError saying the folder was replaced, never the old train split with the new val split."""
    import attnseq.data.tsv as tsv

    folder = tmp_path / "corpus"
    swap_in(folder, {name: f"old {name}\tancien\n" for name in CORPUS_FILES})
    read_pairs, calls = tsv.read_pairs, []

    def rebuild_after_the_first_split(path, *args, **kwargs):
        pairs = read_pairs(path, *args, **kwargs)
        calls.append(path)
        if len(calls) == 1:
            swap_in(folder, {name: f"new {name}\tnouveau\n" for name in CORPUS_FILES})
        return pairs

    monkeypatch.setattr(tsv, "read_pairs", rebuild_after_the_first_split)
    try:
        pairs = read_split_folder(folder)
        assert len(calls) == 3
    except DataError as error:
        assert "replaced" in str(error)
    else:
        assert {split: [pair.source for pair in read] for split, read in pairs.items()} == {
            split: [f"old {split}.tsv"] for split in ("train", "val", "test")}


# -- point 10: long lines --------------------------------------------------------------------------


def test_a_line_longer_than_any_split_keeps_never_reaches_the_tokenizer(tmp_path, monkeypatch):
    """The same examples and pieces with and without a 100,000-word line (and a 300,000-character
    word) in every split, and the tokenizer never sees either line."""
    from attnseq.data.datamodule import Seq2SeqDataModule
    from attnseq.data.tokenizers import SubwordTokenizer

    sources = [f"open file number {i}" for i in range(60)] + ["close the window now", "save all"]
    lines = [f"{source}\t{source.replace('open', 'ouvrir')}\n" for source in sources]
    longest_seen = []
    train, tokenize_all = SubwordTokenizer.train.__func__, SubwordTokenizer.tokenize_all

    def spied_train(cls, kind, texts, vocab_size, lowercase=True):
        texts = list(texts)
        longest_seen.append(max(map(len, texts)))
        return train(cls, kind, texts, vocab_size, lowercase)

    def spied_tokenize_all(self, texts):
        longest_seen.append(max(map(len, texts), default=0))
        return tokenize_all(self, texts)

    monkeypatch.setattr(SubwordTokenizer, "train", classmethod(spied_train))
    monkeypatch.setattr(SubwordTokenizer, "tokenize_all", spied_tokenize_all)

    def examples(name: str, extra: list[str]):
        folder = tmp_path / name
        folder.mkdir()
        for split in ("train", "val", "test"):
            (folder / f"{split}.tsv").write_text("".join(lines + extra), encoding="utf-8")
        data = Seq2SeqDataModule(task="tsv", path=str(folder), train_lengths=[1, 12], eval_lengths=[1, 16],
                                 bucket_width=5, train_size=100, val_size=100, test_size=100, batch_size=8, seed=0,
                                 tokenizer="bpe", vocab_size=120, lowercase=False)
        data.setup()
        return (data.train_examples, data.val_examples, data.test_examples,
                sorted(data.src_tokenizer.model.get_vocab()))

    plain = examples("plain", [])
    longest_seen.clear()
    huge = ["ab " * 100_000 + "\tlong\n", "x" * 300_000 + "\tlong\n"]
    assert examples("huge", huge) == plain
    assert max(longest_seen) < 1000


# -- point 10: plugins -----------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "said"), [("import sys\nsys.exit(0)\n", "sys.exit(0)"),
                                            ("raise RuntimeError('no licence file')\n", "no licence file")])
def test_a_plugin_that_fails_at_import_is_a_config_error_naming_it(body, said, tmp_path):
    module = f"broken_plugin_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(body)
    env = user_env(PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    proc = run_cli(tmp_path, f"plugins=[{module}]", *tiny(max_epochs=1, heatmaps=False), *outputs_under(tmp_path),
                   env=env)
    assert proc.returncode == 2, explain(proc)
    assert module in proc.stderr and said in proc.stderr and "Traceback" not in proc.stderr, explain(proc)
    assert not (tmp_path / "mlflow.db").exists()  # refused before the store was made


MARKING_PLUGIN = '''
"""A plugin that defines nothing and says, in a file, each time it is imported."""
import os
from pathlib import Path

with open(Path(os.environ["PLUGIN_MARKS"]), "a") as marks:
    marks.write("imported\\n")
'''


@pytest.mark.slow
def test_evaluate_imports_a_runs_plugins_only_when_they_are_named(tmp_path):
    from mlflow.tracking import MlflowClient

    module, marks = f"marking_plugin_{uuid.uuid4().hex[:8]}", tmp_path / "marks.txt"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(MARKING_PLUGIN))
    env = user_env(PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]), PLUGIN_MARKS=str(marks))
    trained = run_cli(tmp_path, f"plugins=[{module}]", *tiny(max_epochs=1, heatmaps=False), *outputs_under(tmp_path),
                      env=env)
    assert trained.returncode == 0, explain(trained)
    (run,) = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").search_runs(
        [e.experiment_id for e in MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").search_experiments()])
    assert module in run.data.params["plugins"]  # the run names its plugins
    imports = marks.read_text().count("imported")
    store = f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db"
    settings = ["eval.size=16", "eval.counterfactual=false", f"hydra.run.dir={tmp_path}/eval"]
    refused = run_cli(tmp_path, f"run_id={run.info.run_id}", store, *settings, script=EVALUATE_PY, env=env)
    assert refused.returncode == 2, explain(refused)
    assert f"plugins=[{module}]" in refused.stderr and "Traceback" not in refused.stderr, explain(refused)
    assert marks.read_text().count("imported") == imports  # its code did not run
    named = run_cli(tmp_path, f"run_id={run.info.run_id}", store, *settings, f"plugins=[{module}]",
                    script=EVALUATE_PY, env=env)
    assert named.returncode == 0, explain(named)
    assert marks.read_text().count("imported") > imports
