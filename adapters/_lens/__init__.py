"""TransformerLens components of the adapter (one per file); the public API is
:mod:`bcos_plugins.adapters.transformer_lens`."""
