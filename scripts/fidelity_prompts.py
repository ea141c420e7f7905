"""The fixed prompts of the comparisons with the authors' code (docs/fidelity.md): 20 topics and 20 sums,
worded by each script as the official code it runs beside expects."""

TOPICS = ["the moon", "photosynthesis", "the Roman Empire", "volcanoes", "the piano", "honey bees", "Paris",
          "the internet", "rainbows", "the Nile", "penguins", "chess", "electricity", "the heart", "glaciers",
          "coffee", "Mount Everest", "the printing press", "sharks", "the Olympic Games"]
SUMS = list(zip(range(3, 23), range(17, 57, 2)))  # (a, b): "What is a plus b?"
