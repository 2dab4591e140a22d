"""Audit trail of administrative changes: who changed which quota, membership, drain or window."""
