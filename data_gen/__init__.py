"""Seeded synthetic data (SOK samples, Criteo-like clicks, MovieLens-like ratings), real
MovieLens readers, real Criteo downloads (finding and sampling their day files) and Criteo TSV
preprocessing. Same seed -> byte-identical output.

Imports NumPy, pandas and pyarrow (and the TensorFlow-free dataset writer of
`sok_tutorial.data`), never TensorFlow.
"""
