"""Projects: tokens, projects, agent runs and the live build stream."""
