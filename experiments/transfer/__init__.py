"""Why masked-LM pretraining helps BERT and not Orchid on novel attribution: small models, measured layer by layer
(docs/results/real_data.md, "Why pretrained Orchid transfers worse: diagnosis")."""
