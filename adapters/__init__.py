"""Adapters to host libraries: import the submodule for the library you use."""
