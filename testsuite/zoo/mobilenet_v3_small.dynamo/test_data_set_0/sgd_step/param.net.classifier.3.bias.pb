
Bnet.classifier.3.biasJ(1ƒ:2M=Â‚ß:¸îL¼ZÈ½´iq¼ØXµ¹†ŠŽ=‘è,½µÌ½