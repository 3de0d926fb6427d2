"""RoBERTa on GLUE RTE and CoLA: the report's language experiments."""
