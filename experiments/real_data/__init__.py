"""Orchid against BERT and ViT on real data (``scripts/real_data.sh``): the novels' tasks (``novels``), the
logistic-regression floor (``baselines``) and the report (``report``)."""
