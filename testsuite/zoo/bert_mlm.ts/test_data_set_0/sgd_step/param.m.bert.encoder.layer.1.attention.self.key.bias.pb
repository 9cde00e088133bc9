 B.m.bert.encoder.layer.1.attention.self.key.biasJ€ã½kİ¹ºjê$=W|<X§´;¼4<PA< <éhÔ<ùu<[<<yú»˜°Å»L”y;g„<Ï­¥¼Æp;¯³ö;9ÜÃ<§öj<Ë»«;”¹
º ó@;jBÛº;¾I<|c¼Ë.†=Rº»{ôP¼Ø
¼`UÏ<kÿ=