"""Converters of other ELMo formats into options.json + weights.hdf5 (`elmo-tf convert`)."""
