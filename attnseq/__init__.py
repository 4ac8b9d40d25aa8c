"""attnseq: attention-based sequence-to-sequence models, trained and tracked."""

__version__ = "0.1.0"
