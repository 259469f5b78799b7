"""The history and its verdicts: turn records, the run folder (append-only JSONL), the table of
verdict codes, the exit-code rule, what a request asked, and the masking of secrets. The
lowest room: imports only families/.
"""
