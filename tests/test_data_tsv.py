"""TSV corpora: parsing, tokenisation, one DataError per kind of bad file, splits, filtering."""

import pytest

from attnseq.data.errors import DataError
from attnseq.data.example import Example
from attnseq.data.lengths import filter_by_source_length
from attnseq.data.splits import split_examples
from attnseq.data.tokenizers import SPACE_TOKEN, tokenize
from attnseq.data.tsv import read_tsv


def write(tmp_path, content: bytes, name="pairs.tsv"):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def test_good_file_parsed(tmp_path):
    path = write(tmp_path, "Go.\tVa !\nHello, world!\tBonjour, le monde !\nI don't know.\tJe ne sais pas.\n".encode())
    examples = read_tsv(path)
    assert examples == [
        Example(["go", "."], ["va", "!"], None),
        Example(["hello", ",", "world", "!"], ["bonjour", ",", "le", "monde", "!"], None),
        Example(["i", "don't", "know", "."], ["je", "ne", "sais", "pas", "."], None),
    ]


def test_crlf_bom_and_missing_final_newline(tmp_path):
    path = write(tmp_path, b"\xef\xbb\xbfA b\tC\r\nD\tE f")
    assert read_tsv(path, lowercase=False) == [Example(["A", "b"], ["C"]), Example(["D"], ["E", "f"])]


def test_char_tokenizer(tmp_path):
    path = write(tmp_path, "Hi  you\tÇa\n".encode())
    (example,) = read_tsv(path, tokenizer="char")
    assert example.src == ["h", "i", SPACE_TOKEN, "y", "o", "u"]
    assert example.tgt == ["ç", "a"]


@pytest.mark.parametrize(
    "text, tokenizer, lowercase, expected",
    [
        ("Wait... OK?", "word", True, ["wait", ".", ".", ".", "ok", "?"]),
        ("L'homme mange.", "word", False, ["L'homme", "mange", "."]),
        ("a b", "char", True, ["a", SPACE_TOKEN, "b"]),
    ],
)
def test_tokenize(text, tokenizer, lowercase, expected):
    assert tokenize(text, tokenizer, lowercase) == expected


def test_unknown_tokenizer_is_value_error(tmp_path):
    with pytest.raises(ValueError, match="word, char, bpe, unigram"):
        read_tsv(write(tmp_path, b"a\tb\n"), tokenizer="sentencepiece")


def test_subwords_are_not_a_rule_read_tsv_applies(tmp_path):
    with pytest.raises(ValueError, match="learned from the training split"):
        read_tsv(write(tmp_path, b"a\tb\n"), tokenizer="bpe")


@pytest.mark.parametrize(
    "content, line, problem",
    [
        (b"a\tb\nc d\n", 2, "no tab"),
        (b"a\tb\nc\td\ne\tf\tCC-BY 2.0 attribution\n", 3, "2 tabs"),
        (b"a\tb\n\tx\n", 2, "empty source"),
        (b"a\tb\nc\td\ne\t  \n", 3, "empty target"),
        (b"a\tb\n\nc\td\n", 2, "blank line"),
        (b"a\tb\nc\td\n\xe9t\xe9\t\xe9\n", 3, "UTF-8"),
        (b"ok\tok\n\xff\tx\n", 2, "UTF-8"),
    ],
)
def test_bad_line_raises_data_error_with_path_and_line(tmp_path, content, line, problem):
    path = write(tmp_path, content)
    with pytest.raises(DataError, match=problem) as info:
        read_tsv(path)
    assert info.value.line == line
    assert f"{path}:{line}:" in str(info.value)
    assert "Fix:" in str(info.value)


@pytest.mark.parametrize("content", [None, b"", b"\n \n"], ids=["missing", "empty", "whitespace"])
def test_missing_or_empty_file_raises_data_error_with_path(tmp_path, content):
    path = tmp_path / "pairs.tsv"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match="not found" if content is None else "empty") as info:
        read_tsv(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_data_error_pickles():
    import pickle

    error = DataError("x.tsv", "no tab on this line", "add one", line=4)
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and again.line == 4


def make_examples(n):
    return [Example([f"w{i}"] * (1 + i % 7), [f"t{i}"]) for i in range(n)]


@pytest.mark.parametrize("n, fractions", [(100, (0.8, 0.1, 0.1)), (37, (0.5, 0.25, 0.25)), (10, (1.0, 0.0, 0.0))])
def test_split_is_a_deterministic_partition(n, fractions):
    examples = make_examples(n)
    train, val, test = split_examples(examples, fractions, seed=4)
    assert (train, val, test) == split_examples(examples, fractions, seed=4)
    assert split_examples(examples, fractions, seed=5) != (train, val, test) or fractions[0] == 1.0
    ids = [ex.tgt[0] for ex in train + val + test]
    assert sorted(ids) == sorted(ex.tgt[0] for ex in examples)  # each example exactly once
    assert len(val) == int(fractions[1] * n) and len(test) == int(fractions[2] * n)


@pytest.mark.parametrize("fractions", [(0.5, 0.5), (0.8, 0.3, 0.1), (1.2, -0.1, -0.1)])
def test_split_rejects_bad_fractions(fractions):
    with pytest.raises(ValueError, match="fractions"):
        split_examples(make_examples(10), fractions, seed=0)


@pytest.mark.parametrize("lengths", [(1, 1), (2, 5), (7, 7)])
def test_filter_by_source_length(lengths):
    examples = make_examples(50)
    kept = filter_by_source_length(examples, lengths)
    assert kept == [ex for ex in examples if lengths[0] <= len(ex.src) <= lengths[1]]
    assert kept


def test_old_mac_line_endings_are_named_with_their_fix(tmp_path):
    """A file whose lines end with \\r alone reads as one line with many tabs: say that, not "N tabs … cut -f1,2"."""
    path = write(tmp_path, "".join(f"src {i}\ttgt {i}\r" for i in range(300)).encode())
    with pytest.raises(DataError) as info:
        read_tsv(path)
    message = str(info.value)
    assert "carriage return" in message and "old Mac" in message
    assert "tr '\\r' '\\n'" in info.value.fix
    assert "cut -f1,2" not in message and "tabs on this line" not in message


def test_a_line_run_together_by_lone_carriage_returns_says_so(tmp_path):
    path = write(tmp_path, b"a\tb\nc\td\re\tf\ng\th\n")
    with pytest.raises(DataError, match="carriage returns") as info:
        read_tsv(path)
    assert info.value.line == 2 and "tr '\\r' '\\n'" in info.value.fix


def test_a_directory_is_called_a_directory(tmp_path):
    with pytest.raises(DataError, match="is a directory, not a file") as info:
        read_tsv(tmp_path)
    assert "not found" not in str(info.value)


def data_module(path, **overrides):
    from attnseq.data.datamodule import Seq2SeqDataModule

    settings = dict(task="tsv", path=str(path), train_lengths=[1, 5], eval_lengths=[1, 5], bucket_width=5,
                    train_size=8, val_size=4, test_size=4, batch_size=4, seed=0)
    return Seq2SeqDataModule(**{**settings, **overrides})


def test_a_folder_of_splits_is_used_as_it_is_each_split_capped_at_its_size(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for split, count in (("train", 12), ("val", 3), ("test", 6)):
        write(folder, "".join(f"{split} {i}\t{split.upper()} {i}\n" for i in range(count)).encode(), f"{split}.tsv")
    data = data_module(folder, train_lengths=[2, 2], eval_lengths=[1, 3])
    data.setup()
    assert data.train_examples == [Example(["train", str(i)], ["train", str(i)]) for i in range(8)]  # capped at 8
    assert data.val_examples == [Example(["val", str(i)], ["val", str(i)]) for i in range(3)]  # in file order
    assert [ex.src[1] for ex in data.test_examples] == ["0", "1", "2", "3"]
    assert "val" not in data.src_vocab and "train" in data.src_vocab  # the vocabulary: training only


def test_a_file_keeps_being_split_in_the_size_proportions(tmp_path):
    path = write(tmp_path, "".join(f"w{i}\tt{i}\n" for i in range(40)).encode())
    data = data_module(path, train_size=20, val_size=10, test_size=10, train_lengths=[1, 1], eval_lengths=[1, 1])
    data.setup()
    train, val, test = split_examples(read_tsv(path), [0.5, 0.25, 0.25], seed=0)
    assert (data.train_examples, data.val_examples, data.test_examples) == (train, val, test)


def test_a_folder_without_its_split_files_names_the_missing_one(tmp_path):
    with pytest.raises(DataError, match="lacks train.tsv, val.tsv, test.tsv") as info:
        data_module(tmp_path)
    assert info.value.path == str(tmp_path / "train.tsv")
    assert "a corpus folder holds" in str(info.value) and "single tab-separated file" in info.value.fix
