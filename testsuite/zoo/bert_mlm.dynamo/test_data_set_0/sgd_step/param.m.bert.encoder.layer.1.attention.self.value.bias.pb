 B0m.bert.encoder.layer.1.attention.self.value.biasJ€Ïé={(»Ëq<<Ë\<‹U-¼pjˆ<BX==Øg^<}ÕUº¥=è¼Òˆ»<˜;D#(<s‡<‰û<A|½Àlı¼yÙx¼×»3<Î9Ù<˜ˆ<áö»
«.;g
Q¼Mş;zo,<~<¶Å2<õ@ºµD‡<8<,J=