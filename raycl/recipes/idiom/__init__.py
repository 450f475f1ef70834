"""SemEval-2022 Task 2, Subtask A: idiomaticity detection with EMA and adversarial training (Cui, Xiong, Wang;
SemEval 2022)."""
