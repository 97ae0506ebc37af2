"""The types the layers above share: chat requests and results (``chat``), the stages'
record layout (``records``), structured-output schemas (``schemas``), prompt templates
(``prompts``, ``promptfiles``) and the user profile's ranking (``profile``)."""
