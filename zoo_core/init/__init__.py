"""State-matrix initialisations: HiPPO-LegS and its NPLR/DPLR form (``hippo``), S4D diagonal inits (``diag``).

The eigendecompositions run in float64 / complex128; callers cast at the end.
"""
