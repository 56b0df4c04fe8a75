"""Evaluation on the user's labelled rows: the runner, its targets (a URL, an endpoint or the
engine in-process), the report and the JevBench file format."""
