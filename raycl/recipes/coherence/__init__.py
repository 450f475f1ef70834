"""Coherence modelling with a momentum encoder, a global negative queue and hard negative mining (Jwalapuram,
Joty, Lin; ACL 2022)."""
