"""An example SSM Zoo plugin."""

__version__ = "0.1.0"
