"""GEC with contrastive learning in low error density domains (Cao, Yang, Ng; Findings of EMNLP 2021)."""
