"""The model's data path, one module per stage: ``reshape`` (raw steps to model steps), ``blocks``
(norm, core, mixing), ``stack`` (runs blocks on a depth schedule), ``pools`` (what a task reads),
``model`` (``SequenceModel``: embed, stack, pool, readout; ``model_state`` its streaming state;
``adaptive`` early exits). Everything here imports torch; nothing here builds from specs or touches files.
"""
