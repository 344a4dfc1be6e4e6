"""Recurrent language models behind one interface.

    interface.py   what recurlen needs from a model (RecurrentLM) and the registry entry of an architecture
    registry.py    every architecture by name; the only module above an architecture's folder that names one
    state.py       LayeredState: the typed recurrent state and its lane operations, for every architecture
    official.py    official-format checkpoint I/O (config.json + weights), strict loading
    <arch>/        one folder per architecture (mamba2, mamba1, gla): config, state, scan, kernels, model
"""
