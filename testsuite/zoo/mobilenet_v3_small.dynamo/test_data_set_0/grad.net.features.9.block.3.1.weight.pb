Bnet.features.9.block.3.1.weightJ``9]6[,½7;tH9—ø
¸¦×µ¹zºI¸:¶	Èã·[co¸>ß7¸À8F0ø7[Ý¹Sv¶2¹£f–6Gj	¹58ïg9€üñ8ˆ¥ß9QH³7Ûäö7pÿž9