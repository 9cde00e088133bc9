 B8m.bert.encoder.layer.1.attention.output.LayerNorm.weightJ€hçÛ:¬^½‰¢ê»Ô!k¼™{§»÷pˆ=İÂ»ıu¦:Ja‰;`¨4»
K»)Ò<æö¸º¬‰¼9ï
ºŠa»‘¤†»væŠ»ıs»*Çö»«Š«;>¼[)*<ân¨;›°»<Ñƒ;Ê;à+ı;Ëğ;	NC»öv»er©»