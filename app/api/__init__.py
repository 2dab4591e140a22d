"""The HTTP API: one router module per domain and the request dependencies (deps.py).

The API layer sits above the domains and the live loop (pyproject.toml's import-linter
contract): a router turns a request into a domain call and the result into a response;
nothing below imports it.
"""
