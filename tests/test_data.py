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
    # FLOP is exactly 6 N D for every row (spec §3.1)
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
