"""Tools for driving a real semif-proxy process from tests and benchmarks."""
