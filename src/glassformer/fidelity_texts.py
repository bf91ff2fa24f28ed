"""Two English texts, written for glassformer, that a cheaper precision's answers are
compared on (``glassformer.kernels.fidelity``): ``CALIBRATION`` decides what ``--dtype auto``
chooses, ``HELD_OUT`` (never used to choose) shows in the tests and the docs that the choice
holds on text it was not made on. Plain prose and common punctuation only, so that a character model
trained on a novel can read them too; each is a few hundred tokens for a BPE vocabulary.
"""

CALIBRATION = (
    "The morning train left the station a little after seven, and by the time it reached the "
    "river the fog had lifted from the fields. Margaret sat by the window with a letter she had "
    "not yet opened. It was from her brother, who had gone to the coast in the spring to work "
    "at the harbour, and who wrote seldom and always briefly. She turned it over twice before "
    "she broke the seal.\n\n"
    '"You will think me foolish," he wrote, "but I have taken a small house near the lighthouse, '
    "and I mean to stay the winter. The work is hard and the pay is fair. The keeper's wife "
    "feeds me on Sundays, and her children have taught me the names of every bird on the cliffs. "
    'Come when you can. There is a room for you, and a view of the sea from its window."\n\n'
    "She folded the letter and looked out at the passing farms. A man was leading two horses "
    "along a lane; a woman was hanging washing in a garden; a dog ran beside the train for a "
    "while and then gave up. It was the kind of ordinary scene she had seen a hundred times, "
    "and yet that morning everything seemed to her both very near and very far away.\n\n"
    "At the next town she bought a cup of tea and a newspaper. The paper said that the price of "
    "wheat had risen again, that the council had voted to repair the old bridge, and that a "
    "comet would be visible in the northern sky for the rest of the month. She read every word, "
    "as if the news were meant for her alone, and when the train moved on she was smiling."
)

HELD_OUT = (
    "Water boils at one hundred degrees Celsius at sea level, but on a high mountain it boils at "
    "a lower temperature, because the air presses down on it less. This is why cooking an egg "
    "takes longer in the mountains than by the sea. The same idea explains a pressure cooker: "
    "by sealing the pot, the steam raises the pressure, the water boils at a higher temperature, "
    "and the food cooks faster.\n\n"
    "The largest city of a country is not always its capital. Australia chose Canberra as a "
    "compromise between Sydney and Melbourne, and Brazil built Brasilia in the middle of the "
    "country to draw people inland. In the United States, the capital is Washington, while the "
    "largest city is New York. In France, on the other hand, Paris is both the capital and by "
    "far the largest city.\n\n"
    '"Can you tell me the way to the library?" asked the boy.\n'
    '"Go straight on until you reach the church," said the old woman, "then turn left, and it '
    "is the tall grey building across the square. You cannot miss it. But it closes at five, "
    'so you had better hurry."\n'
    "The boy thanked her and ran off down the street, his books under his arm.\n\n"
    "To make bread, mix flour, water, salt and a little yeast, and knead the dough for ten "
    "minutes until it is smooth. Leave it to rise in a warm place for an hour, shape it into a "
    "loaf, let it rise again, and bake it in a hot oven for about forty minutes. A good loaf "
    "sounds hollow when you tap it underneath."
)
