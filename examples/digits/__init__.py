"""scikit-learn's handwritten digits: real data that ships with scikit-learn, trained in seconds."""
