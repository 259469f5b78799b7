"""The making of DSV4-mini's weights, apart from the serving engine (which never imports it).

- `config.py`: `TrainConfig`, `CorpusConfig` (torch-free; `dsv4bench engine train` reads its
  defaults from them)
- `corpus.py`: the expert-session corpus (rendered by the server's own deepseek-recipe path,
  loss on assistant output only, slipped turns the expert recovers from)
- `renames.py`: worlds whose names are replaced by made-up ones
- `onpolicy.py`: on-policy data (DAgger) and `score`, how a rollout went as the harness judges it
- `trainer.py`: the time-budgeted trainer (torch only)
- `indexer_reliance.py`: how much weights lean on the indexer's picks and on HCA
- `tokenizer_corpus.py`: the texts the tokenizer is trained on (scripts/train_tokenizer.py)
- `evaluation.py`: held-out sessions played against a server, judged by the harness's checkers
  (scripts/eval_engine.py)
"""
