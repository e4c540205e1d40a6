"""Request limits: what a request may cost, checked before anything is built or run.

budget.py         Limits, and the checks of TensorProtos and arrays against them
response_size.py  the response's size estimated before the model runs (proto and JSON)
token_count.py    a sentence's tokens counted as the signature's own tokenizer makes them
byte_units.py     byte units (KiB, MiB) and a size as messages show it (imports nothing)
"""
