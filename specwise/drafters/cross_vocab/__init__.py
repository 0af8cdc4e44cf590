"""A draft model of another vocabulary than the target's: TLI and SLEM (:mod:`.drafter`) over the two vocabularies
side by side (:mod:`.vocabulary`)."""

from specwise.drafters.cross_vocab.drafter import METHODS, CrossVocabDrafter, cross_vocab_drafter
from specwise.drafters.cross_vocab.vocabulary import TokenSpace, VocabularyPair

__all__ = ["METHODS", "CrossVocabDrafter", "TokenSpace", "VocabularyPair", "cross_vocab_drafter"]
