"""Datasets: streaming readers of the raw formats, preparation into stored minibatches
(``prepare``), the on-store layout (``format``) and seeded synthetic data (``synth``)."""
