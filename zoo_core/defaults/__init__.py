"""zoo-core's own default plugins, registered through entry points like any other plugin."""
