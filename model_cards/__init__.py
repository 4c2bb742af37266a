"""Model-card templates (Jinja, rendered through ``huggingface_hub.ModelCard.from_template`` by ``flodl_hf.export.cards``).

``default.md`` is the card every ``flodl-hf train`` run writes as ``README.md`` beside the model.
"""
