"""The certificate and its readers (SPEC 4.4, 4.5).

``build`` turns a session's records into the schema-2 JSON certificate and its verdict;
``numeric_profile`` says which numeric profile applies; ``provenance`` identifies the suite;
``outputs`` refuses an unwritable output before anything runs and writes one whole. Readers:
``read`` (load and check a certificate), ``problems`` (what did not pass and how to rerun it),
``report`` and ``report_html`` (for people), ``diff`` (two certificates), ``verify`` (re-derive a
verdict, merge shards) and ``expectations`` (the expected failures of a run). The commands that
use them are :mod:`gefen_conformance.cli`'s.
"""
