"""What turns raw option probabilities into decisions a caller can threshold: temperature
fitting, the position prior, abstention thresholds and the question types they key on."""
