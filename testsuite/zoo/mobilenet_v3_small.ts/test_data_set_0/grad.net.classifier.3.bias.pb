
Bnet.classifier.3.biasJ(Р╗п=╒кл╬PЗо=Чpм=╓Зг=Gм=>vо=хBк╬~Ье=uг=