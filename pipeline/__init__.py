"""personalized-rewardbench: build benchmarks for personalized reward models."""

__version__ = "0.1.0"
