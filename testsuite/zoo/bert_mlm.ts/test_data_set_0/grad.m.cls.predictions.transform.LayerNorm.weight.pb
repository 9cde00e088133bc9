 B,m.cls.predictions.transform.LayerNorm.weightJ€OÙ
=Apk»ê(—¼à#\»Õ…ñ»!Z†;ÌŠ)¼Ñeº!ÅY¼>f»’¬_º‡n°;æd§<©š„¼'âƒ;):Lza»|OM»sáøº{Ô¼Š™»¯
<—ê³9†D½ºªðq;²ª˜;¤»ƒ¿<Kå¼È7¼»<ÿ»WÞ;