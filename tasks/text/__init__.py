"""Text tasks of papers/002 (You Need to Pay Better Attention, Sec. 4.2, Appendix B.4): review
classification (`task=textcls`: IMDB, Amazon Review Full) and English-to-Spanish translation
(`task=nmt`: Anki, Europarl, both). Tokenisation follows the keras-io examples the paper built on
(tasks/text/tokenize.py); the models are in models/text.py. HF ``datasets`` and ``sacrebleu`` are
imported only inside the functions that read a hub dataset or score BLEU.
"""
from attnbench.tasks.text import classification  # noqa: F401  (registers textcls and its fetcher)
from attnbench.tasks.text import translation  # noqa: F401,E402  (registers nmt and its fetcher)
