"""SemEval-2022 Task 2, Subtask B: idiom-aware sentence embeddings with cross-attention, MSE + InfoNCE and a MoCo
queue (Cui, Xiong, Wang; SemEval 2022)."""
